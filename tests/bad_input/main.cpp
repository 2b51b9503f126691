// The bad-input test module (see test_errors.cpp and test_ieee.cpp).
#define BOOST_TEST_MODULE deft_bad_input
#include <boost/test/unit_test.hpp>
