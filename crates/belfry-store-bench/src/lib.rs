//! Shared pieces of the storage benchmark and the crash tests: the deterministic workload
//! (due times and self-verifying payloads) and readings of the process's own I/O and memory.
//!
//! The workload is a pure function of a task's sequence number, so the raw appender, the
//! belfry engine and fjall all store exactly the same bytes, and a crash test can check any
//! task it finds after a restart without remembering what it wrote.

pub mod crash;
pub mod probe;
pub mod workload;
