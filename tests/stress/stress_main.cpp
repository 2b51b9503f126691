#define BOOST_TEST_MODULE deft stress
#include <boost/test/unit_test.hpp>
