//! `fabric-bench datapath [--quick]`: see `fabric_tests::bench` (run via `cargo xtask bench datapath`).
//! `fabric-bench control`: see `fabric_tests::bench_control` (`cargo xtask bench control`).
//! `fabric-bench operator`: the gateway operator's API requests at rest, alone (also part of
//! `control`); see `fabric_tests::bench_operator`.
use std::process::ExitCode;

use fabric_tests::{bench, install_interrupt_handler, is_root};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str);
    if !matches!(which, Some("datapath" | "control" | "operator"))
        || args.iter().any(|a| a == "-h" || a == "--help")
    {
        eprintln!(
            "usage: fabric-bench datapath [--quick] | fabric-bench control | fabric-bench operator"
        );
        return ExitCode::from(2);
    }
    if !is_root() {
        eprintln!("fabric-bench: needs root (network namespaces, eBPF)");
        return ExitCode::FAILURE;
    }
    install_interrupt_handler();
    if which == Some("operator") {
        return match fabric_tests::bench_operator::run_operator(10) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fabric-bench: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if which == Some("control") {
        return match fabric_tests::bench_control::run(&[1, 10, 100]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("fabric-bench: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let opts = if args.iter().any(|a| a == "--quick") {
        bench::Options::quick()
    } else {
        bench::Options::standard()
    };
    match bench::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabric-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
