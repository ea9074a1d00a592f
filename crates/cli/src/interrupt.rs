//! Interruption: Ctrl-C, SIGTERM or SIGHUP ends the command without leaving a half-written output
//! file behind.

use std::io;

/// Watches for Ctrl-C, SIGTERM and SIGHUP on a background thread; on the first one, removes the
/// partial output files and exits with status 130.
#[cfg(unix)]
pub fn remove_partial_output_on_interrupt() -> io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("interrupt".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                hookscope::output::remove_partial_files();
                eprintln!("interrupted");
                std::process::exit(130);
            }
        })?;
    Ok(())
}

/// Lets a closed pipe end the command quietly, as it ends other Unix tools (`hookscope sites |
/// head`): Rust's runtime ignores SIGPIPE, so that printing to a closed pipe would panic.
#[cfg(unix)]
pub fn end_quietly_on_closed_pipe() {
    // SAFETY: restoring a signal's default disposition, before any other thread runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Elsewhere there is no SIGPIPE.
#[cfg(not(unix))]
pub fn end_quietly_on_closed_pipe() {}

/// Signals are a Unix watch: elsewhere an interrupted `--out` may leave its temporary file.
#[cfg(not(unix))]
pub fn remove_partial_output_on_interrupt() -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "signals are watched on Unix only",
    ))
}
