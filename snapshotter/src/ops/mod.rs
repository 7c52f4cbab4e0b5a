//! The snapshotter's operations, one per file.

mod commit;
mod create;
mod remove;
mod stat;
mod usage;
