//! The command-line tests, in one binary (one link instead of one per file): each module runs
//! the `hookscope` binary built for this test run.

mod bad_input;
mod cli;
mod dictionaries;
mod extract;
mod plugin;
mod serve;
mod support;
mod toolkit;
