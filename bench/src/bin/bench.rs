//! `fabric-bench datapath [--quick]`: see `fabric_bench::datapath` (run via `cargo xtask bench datapath`).
//! `fabric-bench control`: see `fabric_bench::control` (`cargo xtask bench control`).
//! `fabric-bench operator`: the gateway operator's API requests at rest, alone (also part of
//! `control`); see `fabric_bench::operator`.
//! `fabric-bench peering [--runs N] [--memory-peers N]`: see `fabric_bench::peering`
//! (`cargo xtask bench peering`).
//! `fabric-bench offload [--sizes 1,100,1000] [--webhook] [--grace SECS]`: see
//! `fabric_bench::offload` (`cargo xtask bench offload`).
//! `fabric-bench fabric [--quick]`: see `fabric_bench::fabric` (`cargo xtask bench fabric`).
//! `fabric-bench reflection [--quick] [--rate N]`: see `fabric_bench::reflection`
//! (`cargo xtask bench reflection`).
use std::process::ExitCode;

use fabric_bench::datapath;
use fabric_tests::{install_interrupt_handler, is_root};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let which = args.first().map(String::as_str);
    if !matches!(
        which,
        Some(
            "datapath"
                | "control"
                | "operator"
                | "peering"
                | "offload"
                | "reflection"
                | "fabric"
                | "storage"
        )
    ) || args.iter().any(|a| a == "-h" || a == "--help")
    {
        eprintln!(
            "usage: fabric-bench datapath [--quick] | fabric-bench control | fabric-bench operator \
             | fabric-bench peering [--runs N] [--memory-peers N] \
             | fabric-bench offload [--sizes 1,100,1000] [--webhook] [--grace SECS] \
             | fabric-bench reflection [--quick] [--rate CHANGES-PER-SECOND] \
             | fabric-bench fabric [--quick] \
             | fabric-bench storage [--quick] [--runs N] [--move-mib N]"
        );
        return ExitCode::from(2);
    }
    if which == Some("peering") {
        // Two API servers and processes on the host: no namespaces, no root needed.
        install_interrupt_handler();
        let mut opts = fabric_bench::peering::Options::default();
        let number = |flag: &str| -> Option<usize> {
            let i = args.iter().position(|a| a == flag)?;
            args.get(i + 1)?.parse().ok()
        };
        if let Some(n) = number("--runs") {
            opts.runs = n.max(1);
        }
        if let Some(n) = number("--memory-peers") {
            opts.memory_peers = n;
        }
        return finish(fabric_bench::peering::run(&opts));
    }
    if which == Some("offload") {
        // Two API servers and processes on the host, a hollow test node: no root needed.
        install_interrupt_handler();
        let mut opts = fabric_bench::offload::Options::default();
        if let Some(i) = args.iter().position(|a| a == "--sizes") {
            let sizes: Result<Vec<usize>, _> = args
                .get(i + 1)
                .map(String::as_str)
                .unwrap_or_default()
                .split(',')
                .map(str::parse)
                .collect();
            match sizes {
                Ok(s) if !s.is_empty() && !s.contains(&0) => opts.sizes = s,
                _ => {
                    eprintln!("fabric-bench offload: --sizes wants pod counts, e.g. 1,100,1000");
                    return ExitCode::from(2);
                }
            }
        }
        opts.webhook = args.iter().any(|a| a == "--webhook");
        if let Some(i) = args.iter().position(|a| a == "--grace") {
            match args.get(i + 1).and_then(|g| g.parse().ok()) {
                Some(g) => opts.grace = Some(g),
                None => {
                    eprintln!("fabric-bench offload: --grace wants seconds, e.g. 30");
                    return ExitCode::from(2);
                }
            }
        }
        return finish(fabric_bench::offload::run(&opts));
    }
    if which == Some("reflection") {
        // Two API servers and processes on the host, as offload: no root needed.
        install_interrupt_handler();
        let mut opts = if args.iter().any(|a| a == "--quick") {
            fabric_bench::reflection::Options::quick()
        } else {
            fabric_bench::reflection::Options::default()
        };
        if let Some(i) = args.iter().position(|a| a == "--rate") {
            match args.get(i + 1).and_then(|r| r.parse::<f64>().ok()) {
                Some(r) if r > 0.0 => opts.rate = r,
                _ => {
                    eprintln!("fabric-bench reflection: --rate wants changes per second, e.g. 20");
                    return ExitCode::from(2);
                }
            }
        }
        return finish(fabric_bench::reflection::run(&opts));
    }
    if !is_root() {
        eprintln!("fabric-bench: needs root (network namespaces, eBPF)");
        return ExitCode::FAILURE;
    }
    install_interrupt_handler();
    if which == Some("operator") {
        return finish(fabric_bench::operator::run_operator(10));
    }
    if which == Some("fabric") {
        let opts = if args.iter().any(|a| a == "--quick") {
            fabric_bench::fabric::Options::quick()
        } else {
            fabric_bench::fabric::Options::standard()
        }
        .with_other_gateways();
        return finish(fabric_bench::fabric::run(&opts));
    }
    if which == Some("storage") {
        let mut opts = if args.iter().any(|a| a == "--quick") {
            fabric_bench::storage::Options::quick()
        } else {
            fabric_bench::storage::Options::standard()
        };
        let number = |flag: &str| -> Result<Option<u64>, String> {
            let Some(i) = args.iter().position(|a| a == flag) else {
                return Ok(None);
            };
            args.get(i + 1)
                .and_then(|n| n.parse().ok())
                .map(Some)
                .ok_or_else(|| format!("fabric-bench storage: {flag} wants a number"))
        };
        match (number("--runs"), number("--move-mib")) {
            (Ok(runs), Ok(mib)) => {
                if let Some(n) = runs {
                    opts.runs = usize::try_from(n).unwrap_or(usize::MAX).max(1);
                }
                if let Some(m) = mib {
                    opts.move_bytes = m << 20;
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        }
        return finish(fabric_bench::storage::run(&opts));
    }
    if which == Some("control") {
        return finish(fabric_bench::control::run(&[1, 10, 100]));
    }
    let opts = if args.iter().any(|a| a == "--quick") {
        datapath::Options::quick()
    } else {
        datapath::Options::standard()
    };
    finish(datapath::run(&opts))
}

/// The bench's exit: its error, if any, said with its causes.
fn finish(r: anyhow::Result<()>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fabric-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
