//! `hookscope serve`: the embedded model served on an ephemeral loopback port answers a run,
//! stops cleanly on SIGTERM, and refuses to listen off loopback without a token.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};

use crate::support::hookscope;

#[test]
fn serve_answers_a_run_and_stops_cleanly_on_sigterm() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_hookscope"))
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(server.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let body = r#"{"prompts": ["In the beginning"], "max_new_tokens": 2, "greedy": true}"#;
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "POST /v1/run HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"continuation\""), "{answer}");
    // SAFETY: sending a signal to the child this test started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[test]
fn serve_refuses_other_machines_without_a_token() {
    let output = hookscope(&["serve", "--addr", "0.0.0.0:0"]);
    assert_eq!(output.status.code(), Some(1));
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("--token"), "{message}");
}
