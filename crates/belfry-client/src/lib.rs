//! A Rust client for Belfry's HTTP API (work in progress).
