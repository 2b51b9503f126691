// deft's tests across processes: run under mpirun (tests/dist/CMakeLists.txt).
// This unit only defines the module (it generates main()); the job's global
// fixture is in job.cpp, inside the runner's unity build, so that deft's
// headers are compiled once per runner and not here as well.
#define BOOST_TEST_MODULE deft_dist
#include <boost/test/unit_test.hpp>
