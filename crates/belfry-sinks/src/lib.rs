//! Sinks (work in progress).
