//! The results table: each mode's figures and their ratios to boringtun-cli's.
use super::*;

pub(super) fn fmt_opt<T: Copy>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map(f).unwrap_or_else(|| "-".into())
}

pub(super) fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".into(),
    }
}

pub(super) fn print_table(cols: &[(Mode, std::result::Result<Results, String>)]) {
    let get = |m: Mode| {
        cols.iter()
            .find(|(x, _)| *x == m)
            .and_then(|(_, r)| r.as_ref().ok())
            .cloned()
    };
    let (v, b, o, q) = (
        get(Mode::Veth),
        get(Mode::Boringtun),
        get(Mode::Ours),
        get(Mode::OursBusy),
    );
    type Row = (&'static str, fn(&Results) -> Option<f64>, fn(f64) -> String);
    let rows: [Row; 10] = [
        ("TCP 1 stream (Gbit/s)", |r| r.gbps_1, |x| format!("{x:.2}")),
        (
            "  retransmits",
            |r| r.retr_1.map(|x| x as f64),
            |x| format!("{x:.0}"),
        ),
        (
            "  gateway CPU (% of a core)",
            |r| r.cpu_1,
            |x| format!("{x:.0}"),
        ),
        (
            "TCP 4 streams (Gbit/s)",
            |r| r.gbps_4,
            |x| format!("{x:.2}"),
        ),
        (
            "  retransmits",
            |r| r.retr_4.map(|x| x as f64),
            |x| format!("{x:.0}"),
        ),
        (
            "  gateway CPU (% of a core)",
            |r| r.cpu_4,
            |x| format!("{x:.0}"),
        ),
        ("ping RTT avg (ms)", |r| r.rtt_ms, |x| format!("{x:.3}")),
        (
            "  gateway CPU (% of a core)",
            |r| r.cpu_ping,
            |x| format!("{x:.0}"),
        ),
        (
            "client gw VmRSS, 1 peer (MiB)",
            |r| r.rss_kib.map(|k| k as f64 / 1024.0),
            |x| format!("{x:.1}"),
        ),
        (
            "  after the iperf runs (MiB)",
            |r| r.rss_after_kib.map(|k| k as f64 / 1024.0),
            |x| format!("{x:.1}"),
        ),
    ];
    println!(
        "\n{:<30} {:>8} {:>9} {:>8} {:>8} | {:>9} {:>9} {:>9}",
        "metric", "veth", "bt-cli", "ours", "busy", "ours/bt", "busy/bt", "ours/veth"
    );
    println!("{}", "-".repeat(108));
    for (name, f, fmt) in rows {
        let val = |r: &Option<Results>| r.as_ref().and_then(f);
        let (vv, bv, ov, qv) = (val(&v), val(&b), val(&o), val(&q));
        println!(
            "{:<30} {:>8} {:>9} {:>8} {:>8} | {:>9} {:>9} {:>9}",
            name,
            fmt_opt(vv, fmt),
            fmt_opt(bv, fmt),
            fmt_opt(ov, fmt),
            fmt_opt(qv, fmt),
            ratio(ov, bv),
            ratio(qv, bv),
            ratio(ov, vv)
        );
    }
    println!(
        "ours = fabric-gateway defaults (a thread per direction, sleeps between packets); \
         busy = busy_poll_us set (one thread, polls instead of sleeping while traffic flows)"
    );
}
