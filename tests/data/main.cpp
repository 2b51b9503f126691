// The data test module (see test_files.cpp and test_loader.cpp).
#define BOOST_TEST_MODULE deft_data_tests
#include <boost/test/unit_test.hpp>
