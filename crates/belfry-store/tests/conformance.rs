//! The conformance scenarios (`belfry_store::conformance`) on the in-memory reference store
//! and on the embedded engine (which restarts halfway through most scenarios, so durability is
//! checked by the same expectations).

use belfry_store::conformance::Harness;
use belfry_store::{Engine, EngineOptions, MemoryStore, Store};

struct Memory(MemoryStore);

impl Harness for Memory {
    fn store(&self) -> &dyn Store {
        &self.0
    }
    fn reopen(&mut self, _clean: bool) {}
    fn crash(&mut self) {}
}

struct Disk {
    dir: tempfile::TempDir,
    engine: Option<Engine>,
}

impl Disk {
    fn new() -> Disk {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(dir.path(), EngineOptions::default()).unwrap();
        Disk {
            dir,
            engine: Some(engine),
        }
    }
}

impl Harness for Disk {
    fn store(&self) -> &dyn Store {
        self.engine.as_ref().unwrap()
    }
    fn reopen(&mut self, clean: bool) {
        let engine = self.engine.take().unwrap();
        if clean {
            engine.flush().unwrap();
        }
        drop(engine);
        self.engine = Some(Engine::open(self.dir.path(), EngineOptions::default()).unwrap());
    }
    fn crash(&mut self) {
        self.engine.take().unwrap().abandon();
        self.engine = Some(Engine::open(self.dir.path(), EngineOptions::default()).unwrap());
    }
}

fn on_memory(scenario: fn(&mut dyn Harness)) {
    scenario(&mut Memory(MemoryStore::new()));
}

fn on_engine(scenario: fn(&mut dyn Harness)) {
    scenario(&mut Disk::new());
}

mod memory {
    belfry_store::conformance_tests!(super::on_memory);
}

mod engine {
    belfry_store::conformance_tests!(super::on_engine);
}
