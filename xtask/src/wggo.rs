//! wireguard-go for `bench fabric`'s wireguard-go column (issue 22 §1 (b)): the newest Debian
//! build (sid), fetched as the test API server's build fetches sid packages
//! (../shared/kubelite/build.sh): a private apt configuration (its own sources list with the
//! machine's Debian mirror and the sid suite, signed by the system's archive keyring; its own
//! lists, cache and an empty dpkg status), `apt-get download`, then `dpkg-deb -x` into
//! `target/tools/wireguard-go/<version>`. The system's apt and dpkg state is untouched; a
//! version already unpacked is reused without asking the mirror.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

use crate::{output, run, target_dir};

const PACKAGE: &str = "wireguard-go";
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The machine's Debian mirror, from its apt sources (deb822 `URIs:` first, then a one-line
/// `deb` entry), as build.sh picks it (where `$DEBIAN_MIRROR` wins: see [`wireguard_go`]).
pub(crate) fn mirror(deb822: Option<&str>, one_line: Option<&str>) -> Option<String> {
    let from_deb822 = deb822.and_then(|t| {
        t.lines()
            .find_map(|l| l.strip_prefix("URIs:"))
            .and_then(|v| v.split_whitespace().next())
    });
    let from_line = || {
        one_line.and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("deb "))
                .and_then(|rest| {
                    rest.split_whitespace()
                        // Options in brackets come before the URI.
                        .find(|w| w.contains("://"))
                })
        })
    };
    from_deb822.or_else(from_line).map(str::to_owned)
}

/// The private apt configuration: (sources.list, apt.conf) for work directory `w`.
pub(crate) fn apt_files(w: &Path, mirror: &str) -> (String, String) {
    let w = w.display();
    (
        format!("deb [signed-by={KEYRING}] {mirror} sid main\n"),
        format!(
            "Dir::Etc::sourcelist \"{w}/apt/sources.list\";\n\
             Dir::Etc::sourceparts \"/nonexistent\";\n\
             Dir::State::Lists \"{w}/apt/lists\";\n\
             Dir::Cache \"{w}/apt/cache\";\n\
             Dir::State::status \"{w}/apt/status\";\n\
             APT::Install-Recommends \"false\";\n\
             APT::Sandbox::User \"root\";\n"
        ),
    )
}

/// The candidate version from `apt-cache policy` output.
pub(crate) fn candidate(policy: &str) -> Option<String> {
    policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|v| !v.is_empty() && *v != "(none)")
        .map(str::to_owned)
}

/// Where version `v` is unpacked (a Debian version may hold `:`, which paths avoid).
fn unpacked(tools: &Path, v: &str) -> PathBuf {
    tools.join(v.replace(':', "_"))
}

/// The wireguard-go binary: the newest sid build, fetched and unpacked unless it already is.
pub(crate) fn wireguard_go() -> Result<PathBuf> {
    let tools = target_dir().join("tools").join(PACKAGE);
    let w = tools.join("apt-work");
    for d in ["apt/lists/partial", "apt/cache/archives/partial", "debs"] {
        fs::create_dir_all(w.join(d)).with_context(|| format!("creating {}", w.display()))?;
    }
    fs::write(w.join("apt/status"), "")?;
    let m = std::env::var("DEBIAN_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
        .or_else(|| {
            mirror(
                fs::read_to_string("/etc/apt/sources.list.d/debian.sources")
                    .ok()
                    .as_deref(),
                fs::read_to_string("/etc/apt/sources.list").ok().as_deref(),
            )
        })
        .context(
            "no Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list \
         (set DEBIAN_MIRROR)",
        )?;
    let (sources, conf) = apt_files(&w, &m);
    fs::write(w.join("apt/sources.list"), sources)?;
    fs::write(w.join("apt/apt.conf"), conf)?;
    let apt = |prog: &str| {
        let mut c = Command::new(prog);
        c.env("APT_CONFIG", w.join("apt/apt.conf"))
            .stdin(Stdio::null());
        c
    };
    let update = apt("apt-get")
        .args(["-q", "update"])
        .stdout(Stdio::null())
        .status();
    match update {
        Ok(s) if s.success() => {}
        // Offline: an already unpacked version still serves.
        other => {
            if let Some(bin) = newest_unpacked(&tools) {
                println!(
                    "    wireguard-go: sid's lists not refreshed ({other:?}); using {}",
                    bin.display()
                );
                return Ok(bin);
            }
            bail!("apt-get update of sid from {m} failed: {other:?}");
        }
    }
    let policy = output(apt("apt-cache").args(["policy", PACKAGE]))?;
    let v =
        candidate(&policy).with_context(|| format!("sid at {m} has no {PACKAGE}:\n{policy}"))?;
    let root = unpacked(&tools, &v);
    let bin = root.join("usr/bin").join(PACKAGE);
    if bin.is_file() {
        println!("    wireguard-go {v} (sid): present");
        return Ok(bin);
    }
    let debs = w.join("debs");
    for e in fs::read_dir(&debs)? {
        let _ = fs::remove_file(e?.path());
    }
    run(apt("apt-get")
        .current_dir(&debs)
        .args(["-q", "download", &format!("{PACKAGE}={v}")]))
    .context("downloading wireguard-go from sid")?;
    let deb = fs::read_dir(&debs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let tmp = tools.join(format!(".unpack-{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp))
        .context("unpacking wireguard-go")?;
    anyhow::ensure!(
        tmp.join("usr/bin").join(PACKAGE).is_file(),
        "{} holds no usr/bin/{PACKAGE}",
        deb.display()
    );
    // Whole or not at all: a killed unpack leaves only the temporary directory.
    fs::rename(&tmp, &root)
        .with_context(|| format!("moving the unpacked tree to {}", root.display()))?;
    println!("    wireguard-go {v} (sid): unpacked in {}", root.display());
    Ok(bin)
}

/// The newest version unpacked before, by modification time.
fn newest_unpacked(tools: &Path) -> Option<PathBuf> {
    fs::read_dir(tools)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("usr/bin").join(PACKAGE))
        .filter(|b| b.is_file())
        .max_by_key(|b| b.metadata().and_then(|m| m.modified()).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_comes_from_the_machines_sources() {
        let deb822 = "Types: deb\n# http://snapshot.debian.org/x\nURIs: http://deb.debian.org/debian\n\
                      Suites: bookworm\n\nTypes: deb\nURIs: http://deb.debian.org/debian-security\n";
        assert_eq!(
            mirror(Some(deb822), None).as_deref(),
            Some("http://deb.debian.org/debian")
        );
        let line = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://ftp.de.debian.org/debian bookworm main\n";
        assert_eq!(
            mirror(None, Some(line)).as_deref(),
            Some("http://ftp.de.debian.org/debian")
        );
        assert_eq!(mirror(Some("Types: deb\n"), Some("")), None);
    }

    #[test]
    fn the_apt_configuration_is_private_and_sid() {
        let (sources, conf) = apt_files(Path::new("/t/w"), "http://m/debian");
        assert_eq!(
            sources,
            format!("deb [signed-by={KEYRING}] http://m/debian sid main\n")
        );
        for want in [
            "Dir::Etc::sourcelist \"/t/w/apt/sources.list\";",
            "Dir::Etc::sourceparts \"/nonexistent\";",
            "Dir::State::Lists \"/t/w/apt/lists\";",
            "Dir::Cache \"/t/w/apt/cache\";",
            "Dir::State::status \"/t/w/apt/status\";",
        ] {
            assert!(conf.contains(want), "{want} missing from\n{conf}");
        }
    }

    #[test]
    fn candidate_reads_apt_cache_policy() {
        let p =
            "wireguard-go:\n  Installed: (none)\n  Candidate: 0.0.20260522-1\n  Version table:\n";
        assert_eq!(candidate(p).as_deref(), Some("0.0.20260522-1"));
        assert_eq!(
            candidate("wireguard-go:\n  Installed: (none)\n  Candidate: (none)\n"),
            None
        );
        assert_eq!(candidate(""), None);
        assert_eq!(
            unpacked(Path::new("/t"), "1:0.0.1-1"),
            PathBuf::from("/t/1_0.0.1-1")
        );
    }
}
