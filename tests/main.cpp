#define BOOST_TEST_MODULE deft
#include <boost/test/unit_test.hpp>
