//! Belfry's storage: the [`Store`] trait every backend implements, the embedded timeline
//! engine, and [`MemoryStore`], the simple reference implementation the engine is tested
//! against.

#[cfg(feature = "conformance")]
pub mod conformance;
pub mod engine;
mod forward;
pub mod memory;
mod store;

pub use engine::{
    Engine, EngineOptions, FsyncPolicy, CHECKPOINT_WAL_BYTES_DEFAULT,
    FREE_SPACE_RESERVE_BYTES_DEFAULT,
};
pub use forward::ForwardingStore;
pub use memory::MemoryStore;
pub use store::*;
