//! Server (work in progress).
