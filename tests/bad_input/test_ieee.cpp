#include "bad_input.hpp"
