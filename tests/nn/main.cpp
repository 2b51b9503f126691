#define BOOST_TEST_MODULE deft_nn
#include <boost/test/unit_test.hpp>
