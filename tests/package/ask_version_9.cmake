# Injected after the consumer's project(): find_package(deft 9.0) must fail
# against deft 0.1 (the version file's compatibility check).
find_package(deft 9.0 CONFIG REQUIRED)
