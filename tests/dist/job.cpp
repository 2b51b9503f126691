// One global fixture joins the job before the first test and leaves it after
// the last, as a program would.
#include <boost/test/unit_test.hpp>

#include <deft/dist.hpp>

namespace {
struct Job {
  Job() { deft::dist::init(&boost::unit_test::framework::master_test_suite().argc,
                           &boost::unit_test::framework::master_test_suite().argv); }
  ~Job() {
    try {
      deft::dist::finalize();
    } catch (...) {  // a failure was reported by the test that caused it
    }
  }
};
}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(Job);
