#define BOOST_TEST_MODULE deft_autograd
#include <boost/test/unit_test.hpp>
