//! How the demo prints, and the few calls every section makes (kubectl, fabricctl, a wait
//! with a deadline).
use super::*;

pub(crate) fn elapsed() -> String {
    format!(
        "{:.1} s",
        START.get_or_init(Instant::now).elapsed().as_secs_f64()
    )
}

pub(crate) fn title(s: &str) {
    println!("\n=== {s}   [{}]", elapsed());
}

pub(crate) fn indent(s: &str) {
    for l in s.lines() {
        println!("    {l}");
    }
}

/// Shows what a command printed, or why it failed: a display that does not work is reported
/// and the demo goes on.
pub(crate) fn show(r: Result<String>) {
    match r {
        Ok(s) => indent(&s),
        Err(e) => println!("    (failed: {e:#})"),
    }
}

pub(crate) fn kubectl(api: &ApiServer, args: &[&str]) -> Result<String> {
    let o = api.kubectl(args);
    if !o.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

pub(crate) fn get_json(api: &ApiServer, args: &[&str]) -> Option<Value> {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&kubectl(api, &a).ok()?).ok()
}

pub(crate) fn fabricctl(api: &ApiServer, args: &[&str]) -> Result<String> {
    let o = Command::new(locate_bin("fabricctl")?)
        .env("KUBECONFIG", &api.kubeconfig)
        .env_remove("FABRIC_PEERING_TOKEN")
        .args(args)
        .output()?;
    if !o.status.success() {
        bail!(
            "fabricctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Polls `f` every 250 ms until it gives a value, for at most `timeout`.
pub(crate) fn wait<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T> {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        check_interrupt()?;
        if t0.elapsed() > timeout {
            bail!("{what}: not within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
