#define BOOST_TEST_MODULE deft_conv
#include <boost/test/unit_test.hpp>
