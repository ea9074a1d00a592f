//! The conformance crate's integration tests but the suite, in one binary (one link of the
//! burn stack instead of one per file). The suite stays a binary of its own: CI runs it again on
//! the other backends.

mod common;
mod decoders;
mod deltanet;
mod demo_model;
mod dictionaries;
mod edits;
mod engine;
mod extract;
mod fuzz;
mod gemma;
mod generation;
mod gradients;
mod indexing;
mod loading;
mod mamba;
mod mamba2;
mod parity;
mod precision;
