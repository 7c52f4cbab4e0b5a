//! Crab's evaluation: recorded agent trajectories replayed in real sandboxes,
//! a crash injected, recovery by each strategy, and the task's own check
//! deciding correctness (see `docs/evaluation.md`).

pub mod agent;
pub mod demo;
pub mod density;
pub mod outcome;
pub mod plot;
pub mod provenance;
pub mod replay;
pub mod report;
pub mod run;
pub mod runc;
pub mod sandbox;
pub mod state;
pub mod strategy;
pub mod trajectory;
