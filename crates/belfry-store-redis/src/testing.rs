//! Throwaway redis-server processes for tests (filled in by the test-harness work).
