//! The test node's built-in pod program (the image is ignored; a pod runs a command):
//! - `echo --port P [--print-env NAME]...`: a TCP server that answers each connection with the
//!   client address it sees (`10.72.1.10:41234\n`) and closes; what the fabric tests care
//!   about is which source address arrives. It first prints `NAME=value` for each variable
//!   asked for (what its ConfigMaps and Secrets gave it).
//! - `http --port P`: the same over HTTP/1.0 (`GET /` answers the client address).
//! - `connect ADDR:PORT`: connects, prints what the server answered, exits 0 (1 on failure).
//! - `exit CODE [--after SECONDS]`: prints a line and exits with CODE.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Built-in test pod programs of fabric-test-node")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// TCP echo of the client's address.
    Echo {
        #[arg(long, default_value_t = 8080)]
        port: u16,
        #[arg(long = "print-env", value_name = "NAME")]
        print_env: Vec<String>,
    },
    /// HTTP server answering the client's address.
    Http {
        #[arg(long, default_value_t = 8080)]
        port: u16,
    },
    /// Connects and prints the answer.
    Connect {
        addr: SocketAddr,
        #[arg(long, default_value_t = 3)]
        timeout_secs: u64,
    },
    /// Prints a line and exits with CODE.
    Exit {
        code: i32,
        #[arg(long, default_value_t = 0.0)]
        after: f64,
    },
}

fn serve(port: u16, http: bool) -> Result<()> {
    let l = TcpListener::bind(("0.0.0.0", port)).with_context(|| format!("binding port {port}"))?;
    println!("listening on {}", l.local_addr()?);
    for conn in l.incoming() {
        let Ok(mut s) = conn else { continue };
        let Ok(peer) = s.peer_addr() else { continue };
        println!("connection from {peer}");
        std::thread::spawn(move || {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let answer = if http {
                // The request head is read (and ignored) before answering.
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let body = format!("{peer}\n");
                format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
            } else {
                format!("{peer}\n")
            };
            let _ = s.write_all(answer.as_bytes());
        });
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let r = match Cli::parse().cmd {
        Cmd::Echo { port, print_env } => {
            for name in print_env {
                println!("{name}={}", std::env::var(&name).unwrap_or_default());
            }
            serve(port, false)
        }
        Cmd::Http { port } => serve(port, true),
        Cmd::Connect { addr, timeout_secs } => (|| {
            let t = Duration::from_secs(timeout_secs);
            let mut s = TcpStream::connect_timeout(&addr, t)
                .with_context(|| format!("connecting to {addr}"))?;
            s.set_read_timeout(Some(t))?;
            let mut out = String::new();
            s.read_to_string(&mut out).context("reading the answer")?;
            print!("{out}");
            Ok(())
        })(),
        Cmd::Exit { code, after } => {
            println!("exiting with {code}");
            std::thread::sleep(Duration::from_secs_f64(after));
            return std::process::ExitCode::from(code as u8);
        }
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
