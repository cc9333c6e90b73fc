//! `cargo xtask bench storage`: what the storage fabric costs a stateful pod, and what moving a
//! volume gets (issue 21).
//!
//! The fixture's two clusters with their sharing layers ([`fabric_tests::peering_stack`]): A peers
//! with B as a consumer, asking for some of the storage B lends of its class `standard`;
//! namespace `bench-storage` of A is offloaded `LocalAndRemote` to B. Then, from one run:
//! - **First consumer**: a claim of the fabric's StorageClass (`WaitForFirstConsumer`) created
//!   together with the pod that mounts it, the pod placed on A's real node or on B's virtual
//!   node; from the creation until the claim is Bound and until the pod is Running (p50 and
//!   max of the runs), and the ratio virtual/real. On a real node the storage provisioner makes
//!   a real claim of A's class; on the virtual node the claim is made in B's twin namespace and
//!   the pod runs on B.
//! - **Move**: a claim bound on A's node holding the bench's bytes, moved to B with
//!   `fabricctl move volume`: the whole command (checks, the claim in the twin, the transfer
//!   pods, the copy, the hand-over), and the copy alone (from the receiver running to the
//!   sender's digest, as the command's progress shows them, to within its 1 s poll), against a
//!   plain TCP copy of as many bytes from A's pod to B's pod over the same tunnel; then the
//!   same claim moved home (`--to local`: the sender on B listens, the receiver here fills a
//!   landing claim), against a plain copy from B's pod to A's.
//!
//! Figures from one run, ratios within it: a benchmark, never a timed test.
use std::{
    io::{BufRead as _, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use fabric_api::names;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::{Value, json};

use fabric_tests::{
    check_interrupt,
    clusters::{self, Cluster},
    die_with_parent,
    figures::{load_average, percentile, profile, secs},
    kube_sync, locate_bin,
    manifests::Manifests,
    peering_stack::{ADVERTISED_LABEL, PeeringStack, SharingClusters},
    traffic,
    workloads::{command_pod, echo_pod, on_node},
};

/// The namespace offloaded to B whose claims the bench makes.
const NS: &str = "bench-storage";
/// The port of the plain copy's receiver in B's pod.
const PLAIN_PORT: u16 = 7301;

#[derive(Debug, Clone)]
pub struct Options {
    /// First consumers timed per placement.
    pub runs: usize,
    /// Bytes the moved claim holds (and the plain copy sends).
    pub move_bytes: u64,
}

impl Options {
    pub fn standard() -> Self {
        Self {
            runs: 5,
            move_bytes: 256 << 20,
        }
    }

    pub fn quick() -> Self {
        Self {
            runs: 2,
            move_bytes: 32 << 20,
        }
    }
}

/// Where a first consumer ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Real,
    Virtual,
}

/// One first consumer: from the creation of the claim and its pod until the claim was Bound and
/// until the pod was Running.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FirstConsumer {
    pub bound: Duration,
    pub running: Duration,
}

/// What a move and the plain copy the same way took.
#[derive(Debug, Clone, PartialEq)]
pub struct Move {
    /// Which way (`A to B`), and the plain copy's ends (`A's pod to B's pod`).
    pub way: &'static str,
    pub plain_way: &'static str,
    pub bytes: u64,
    pub whole: Duration,
    /// The copy alone, when the command's output showed where it began and ended.
    pub copy: Option<Duration>,
    pub plain: Duration,
}

/// MiB per second of `bytes` in `d`.
pub fn mib_per_sec(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1u64 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

/// The copy's span in `fabricctl move volume`'s output, each line with when it was read: from
/// the listening side reported running (`receiver|sender ... running on ...`) to the
/// sender's digest (`sent N bytes sha256 ...`).
pub fn copy_span(lines: &[(Duration, String)]) -> Option<Duration> {
    let start = lines
        .iter()
        .find(|(_, l)| {
            (l.starts_with("receiver ") || l.starts_with("sender ")) && l.contains(" running on ")
        })?
        .0;
    let end = lines
        .iter()
        .find(|(_, l)| l.starts_with("sent ") && l.contains(" sha256 "))?
        .0;
    end.checked_sub(start)
}

/// p50 and max of `d` (sorted here), which must not be empty.
fn p50_max(d: &[Duration]) -> (Duration, Duration) {
    let mut d = d.to_vec();
    d.sort();
    (percentile(&d, 0.5), d.last().copied().unwrap_or_default())
}

/// The report: first consumers by placement, the move against the plain copy.
pub fn report(real: &[FirstConsumer], virt: &[FirstConsumer], moves: &[Move]) -> String {
    let mut s = String::new();
    let row = |what: &str, runs: &[FirstConsumer]| {
        let (b50, bmax) = p50_max(&runs.iter().map(|r| r.bound).collect::<Vec<_>>());
        let (r50, rmax) = p50_max(&runs.iter().map(|r| r.running).collect::<Vec<_>>());
        format!(
            "  {what:<24} {:>9} {:>9}   {:>9} {:>9}\n",
            secs(b50),
            secs(bmax),
            secs(r50),
            secs(rmax)
        )
    };
    s += &format!(
        "first consumer of a claim of class {}, created with its pod ({} runs each):\n",
        names::storage::CLASS,
        real.len().max(virt.len())
    );
    s += &format!(
        "  {:<24} {:>9} {:>9}   {:>9} {:>9}\n",
        "pod placed on", "Bound p50", "max", "Running p50", "max"
    );
    for (what, runs) in [("A's real node", real), ("B's virtual node", virt)] {
        if !runs.is_empty() {
            s += &row(what, runs);
        }
    }
    let p50 = |runs: &[FirstConsumer], f: fn(&FirstConsumer) -> Duration| {
        p50_max(&runs.iter().map(f).collect::<Vec<_>>()).0
    };
    if !real.is_empty() && !virt.is_empty() {
        let ratio = |f: fn(&FirstConsumer) -> Duration| {
            p50(virt, f).as_secs_f64() / p50(real, f).as_secs_f64().max(1e-9)
        };
        s += &format!(
            "  virtual / real (p50): Bound {:.1}x, Running {:.1}x\n",
            ratio(|r| r.bound),
            ratio(|r| r.running)
        );
    }
    for m in moves {
        let mib = m.bytes as f64 / (1u64 << 20) as f64;
        s += &format!("\nmove of a claim holding {mib:.0} MiB, {}:\n", m.way);
        s += &format!(
            "  {:<44} {:>8}  {:>8.1} MiB/s\n",
            "fabricctl move volume, the whole command",
            secs(m.whole),
            mib_per_sec(m.bytes, m.whole)
        );
        if let Some(c) = m.copy {
            s += &format!(
                "  {:<44} {:>8}  {:>8.1} MiB/s\n",
                "  of which the copy (to within 1 s)",
                secs(c),
                mib_per_sec(m.bytes, c)
            );
        }
        s += &format!(
            "  {:<44} {:>8}  {:>8.1} MiB/s\n",
            format!("plain TCP copy, {}", m.plain_way),
            secs(m.plain),
            mib_per_sec(m.bytes, m.plain)
        );
        let whole = m.plain.as_secs_f64() / m.whole.as_secs_f64().max(1e-9);
        s += &format!("  move / plain copy (throughput): whole {whole:.2}x");
        if let Some(c) = m.copy {
            s += &format!(
                ", copy alone {:.2}x",
                m.plain.as_secs_f64() / c.as_secs_f64().max(1e-9)
            );
        }
        s.push('\n');
    }
    s
}

/// The bench's bed: the clusters, their sharing layers, A peered with B, `NS` offloaded.
struct Bed {
    sharing: SharingClusters,
    b_id: String,
}

impl Bed {
    fn logs(&self) -> String {
        self.sharing.logs()
    }

    fn up() -> Result<Self> {
        let sharing = SharingClusters::start(1, false)?;
        let b_id = sharing.cl.b.id.clone();
        let mut bed = Self { sharing, b_id };
        if let Err(e) = bed.peer_and_offload() {
            bail!("{e:#}\n{}", bed.logs());
        }
        Ok(bed)
    }

    fn peer_and_offload(&mut self) -> Result<()> {
        let (a, b) = (&self.sharing.cl.a, &self.sharing.cl.b);
        b.lend_storage("standard=8Gi")?;
        let class = Manifests::rendered(&a.api)?
            .into_iter()
            .find(|o| o["kind"] == "StorageClass" && o["metadata"]["name"] == names::storage::CLASS)
            .context("deploy/ has no StorageClass fabric")?;
        a.create(&class).context("the fabric's StorageClass on A")?;
        let words = self.sharing.stack.peer_command(&self.sharing.cl, 2, &[])?;
        let ask = [
            "--cpu",
            "2",
            "--memory",
            "4Gi",
            "--pods",
            "50",
            "--resource",
            "storage.fabric.io/standard=4Gi",
        ];
        PeeringStack::run_peer_command(&mut self.sharing.cl, 1, &words, &ask, &[1, 2], |_| {})?;
        let a = &self.sharing.cl.a;
        a.api.kubectl_ok(&["create", "namespace", NS]);
        let selector = format!("{ADVERTISED_LABEL}={}", self.b_id);
        let o = fabric_tests::process::fabricctl(
            &a.api.kubeconfig,
            &[
                "offload",
                "namespace",
                NS,
                "--pod-offloading-strategy",
                "LocalAndRemote",
                "--selector",
                &selector,
            ],
        );
        if !o.status.success() {
            bail!(
                "fabricctl offload namespace {NS}: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(())
    }

    /// A pod of `NS` mounting `claim` at /srv.
    fn pod_of(&self, pod: Value, claim: &str, placement: Placement) -> Value {
        let mut pod = match placement {
            Placement::Real => on_node(pod, 0),
            Placement::Virtual => {
                let mut p = pod;
                p["spec"]["nodeSelector"] = json!({ ADVERTISED_LABEL: self.b_id });
                p
            }
        };
        pod["metadata"]["namespace"] = json!(NS);
        pod["spec"]["containers"][0]["volumeMounts"] =
            json!([{ "name": "data", "mountPath": "/srv" }]);
        pod["spec"]["volumes"] =
            json!([{ "name": "data", "persistentVolumeClaim": { "claimName": claim } }]);
        pod
    }

    /// One first consumer placed so, timed; then the pod and the claim deleted and gone.
    fn first_consumer(&self, name: &str, placement: Placement) -> Result<FirstConsumer> {
        let client = kube_sync::client(&self.sharing.cl.a.api.kubeconfig)?;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
        let pods: Api<Pod> = Api::namespaced(client, NS);
        let claim: PersistentVolumeClaim = serde_json::from_value(claim(name, "64Mi"))?;
        let pod: Pod = serde_json::from_value(self.pod_of(echo_pod(name), name, placement))?;
        let name = name.to_owned();
        kube_sync::block(async move {
            let name = name.as_str();
            let timeout = Duration::from_secs(120);
            let t0 = Instant::now();
            claims.create(&PostParams::default(), &claim).await?;
            pods.create(&PostParams::default(), &pod).await?;
            let (mut bound, mut running) = (None, None);
            while bound.is_none() || running.is_none() {
                if t0.elapsed() > timeout {
                    bail!("{name}: not Bound and Running after {timeout:?}");
                }
                if bound.is_none() {
                    let c = claims.get(name).await?;
                    if c.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                        bound = Some(t0.elapsed());
                    }
                }
                if running.is_none() {
                    let p = pods.get(name).await?;
                    match p.status.and_then(|s| s.phase).as_deref() {
                        Some("Running") => running = Some(t0.elapsed()),
                        Some(phase @ ("Failed" | "Succeeded")) => bail!("{name} ended {phase}"),
                        _ => {}
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let gone = DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            };
            pods.delete(name, &gone).await?;
            wait_gone(&pods, name, timeout).await?;
            claims.delete(name, &DeleteParams::default()).await?;
            wait_gone(&claims, name, timeout).await?;
            Ok(FirstConsumer {
                bound: bound.unwrap_or_default(),
                running: running.unwrap_or_default(),
            })
        })
    }

    /// `fabricctl move volume NS/name --to to` at A, each line of its output with when it was
    /// read; the whole command's time.
    fn fabricctl_move(&self, name: &str, to: &str) -> Result<(Vec<(Duration, String)>, Duration)> {
        let a = &self.sharing.cl.a;
        let mut child = die_with_parent(&mut Command::new(locate_bin("fabricctl")?))
            .env("KUBECONFIG", &a.api.kubeconfig)
            .args(["move", "volume", &format!("{NS}/{name}"), "--to", to])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting fabricctl move volume")?;
        let t0 = Instant::now();
        let stdout = child.stdout.take().context("fabricctl's stdout")?;
        let stderr = child.stderr.take().context("fabricctl's stderr")?;
        let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
        let lines: Vec<(Duration, String)> = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .map(|l| (t0.elapsed(), l))
            .collect();
        let status = child.wait()?;
        let whole = t0.elapsed();
        let out: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
        if !status.success() {
            bail!(
                "fabricctl move volume --to {to} failed ({status}):\n{out}{}",
                err.join().unwrap_or_default()
            );
        }
        if !out.contains("checksums match") {
            bail!("the move did not say its checksums matched:\n{out}");
        }
        Ok((lines, whole))
    }

    /// A claim bound on A's node holding `bytes` of data, moved to B, then the plain copy; the
    /// same claim moved home, then the plain copy back.
    fn move_volume(&self, bytes: u64) -> Result<Vec<Move>> {
        let a = &self.sharing.cl.a;
        let name = "moved";
        a.create(&claim(name, &format!("{}Mi", (bytes >> 20) + 64)))?;
        let writer = format!("{name}-writer");
        a.create_pod(&self.pod_of(
            command_pod(&writer, &["fabric-test-pod", "write", "/srv/seed", "x"]),
            name,
            Placement::Real,
        ))?;
        a.wait_pod_succeeded(NS, &writer, Duration::from_secs(120))?;
        a.api
            .kubectl_ok(&["delete", "pod", &writer, "-n", NS, "--wait=true"]);
        // The volume's directory on the host (the test provisioner's hostPath): the bytes are
        // written there directly, as a pod would have.
        let volume = a.api.kubectl_ok(&[
            "get",
            "persistentvolumeclaim",
            name,
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.volumeName}",
        ]);
        let dir = PathBuf::from(a.api.kubectl_ok(&[
            "get",
            "persistentvolume",
            volume.trim(),
            "-o",
            "jsonpath={.spec.hostPath.path}",
        ]));
        write_data(&dir.join("data"), bytes)?;

        let (lines, whole) = self.fabricctl_move(name, &self.b_id)?;
        check_interrupt()?;

        let cidr = a.remote_pod_cidr(&self.b_id, Duration::from_secs(30))?;
        let dst = clusters::remap(Cluster::pod_ip(0).parse()?, cidr).to_string();
        let (got, plain) = traffic::tcp_copy(
            &a.pods[0],
            &self.sharing.cl.b.pods[0],
            &dst,
            PLAIN_PORT,
            usize::try_from(bytes)?,
            Duration::from_secs(600),
        )
        .context("the plain copy")?;
        if got as u64 != bytes {
            bail!("the plain copy delivered {got} of {bytes} bytes");
        }
        let there = Move {
            way: "A to B",
            plain_way: "A's pod to B's pod",
            bytes,
            whole,
            copy: copy_span(&lines),
            plain,
        };
        check_interrupt()?;

        println!("moving it home from B ...");
        let (lines, whole) = self.fabricctl_move(name, "local")?;
        check_interrupt()?;
        let b = &self.sharing.cl.b;
        let cidr = b.remote_pod_cidr(&a.id, Duration::from_secs(30))?;
        let dst = clusters::remap(Cluster::pod_ip(0).parse()?, cidr).to_string();
        let (got, plain) = traffic::tcp_copy(
            &b.pods[0],
            &a.pods[0],
            &dst,
            PLAIN_PORT,
            usize::try_from(bytes)?,
            Duration::from_secs(600),
        )
        .context("the plain copy back")?;
        if got as u64 != bytes {
            bail!("the plain copy back delivered {got} of {bytes} bytes");
        }
        Ok(vec![
            there,
            Move {
                way: "B to A (home)",
                plain_way: "B's pod to A's pod",
                bytes,
                whole,
                copy: copy_span(&lines),
                plain,
            },
        ])
    }
}

/// A claim of the fabric's class in `NS`.
fn claim(name: &str, size: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"storageClassName": names::storage::CLASS, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": size}}}})
}

/// `bytes` of data that does not compress to nothing (a sparse file, or zeros, would flatter a
/// copy that skips holes).
fn write_data(path: &std::path::Path, bytes: u64) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut left = bytes;
    let mut block = vec![0u8; 1 << 20];
    while left > 0 {
        for w in block.chunks_exact_mut(8) {
            // xorshift64: cheap bytes with no pattern a copy could take a shortcut through.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = usize::try_from(left.min(block.len() as u64))?;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    f.get_ref().sync_all()?;
    Ok(())
}

async fn wait_gone<K>(api: &Api<K>, name: &str, timeout: Duration) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let t0 = Instant::now();
    while api.get_opt(name).await?.is_some() {
        if t0.elapsed() > timeout {
            bail!("{name} still there after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub fn run(o: &Options) -> Result<()> {
    println!(
        "storage benchmark ({} build): a claim's first consumer on a real node against one on a \
         virtual node, and a volume moved between clusters against a plain copy",
        profile()
    );
    println!("machine load at the start: {}", load_average());
    println!("building the fixture's two clusters, their sharing layers, A peered with B ...");
    let bed = Bed::up()?;
    check_interrupt()?;
    let (mut real, mut virt) = (Vec::new(), Vec::new());
    for i in 0..o.runs {
        for (placement, runs) in [
            (Placement::Real, &mut real),
            (Placement::Virtual, &mut virt),
        ] {
            check_interrupt()?;
            let name = match placement {
                Placement::Real => format!("real-{i}"),
                Placement::Virtual => format!("virtual-{i}"),
            };
            let r = bed
                .first_consumer(&name, placement)
                .with_context(|| format!("first consumer {name}\n{}", bed.logs()))?;
            println!(
                "  {name}: Bound after {}, Running after {}",
                secs(r.bound),
                secs(r.running)
            );
            runs.push(r);
        }
    }
    let moves = if o.move_bytes > 0 {
        println!("moving a claim of {} MiB to B ...", o.move_bytes >> 20);
        bed.move_volume(o.move_bytes)
            .with_context(|| format!("the move\n{}", bed.logs()))?
    } else {
        Vec::new()
    };
    println!("machine load at the end: {}\n", load_average());
    print!("{}", report(&real, &virt, &moves));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: f64) -> Duration {
        Duration::from_secs_f64(x)
    }

    #[test]
    fn the_copy_spans_receiver_running_to_the_sender_s_digest() {
        let lines: Vec<(Duration, String)> = [
            (0.5, "checks: claim store/data, 0 pods use it"),
            (
                2.0,
                "receiver move-data-receive running on provider b, at 10.1.2.3",
            ),
            (3.0, "sent 1048576 bytes"),
            (7.5, "sent 4194304 bytes sha256 ab12"),
            (8.0, "received 4194304 bytes sha256 ab12"),
        ]
        .into_iter()
        .map(|(t, l)| (s(t), l.to_owned()))
        .collect();
        assert_eq!(copy_span(&lines), Some(s(5.5)));
        // Home: the sender listens on the provider, and is the one said running.
        let mut home = lines.clone();
        home[1].1 = "sender move-data-send running on provider b, at 10.1.2.3".into();
        assert_eq!(copy_span(&home), Some(s(5.5)));
        // A move that never said where the copy began, or ended, has no copy span.
        assert_eq!(copy_span(&lines[2..]), None);
        assert_eq!(copy_span(&lines[..3]), None);
    }

    #[test]
    fn throughput_in_mib_per_second() {
        assert!((mib_per_sec(256 << 20, s(2.0)) - 128.0).abs() < 1e-9);
    }

    #[test]
    fn the_report_gives_ratios_within_the_run() {
        let fc = |b: f64, r: f64| FirstConsumer {
            bound: s(b),
            running: s(r),
        };
        let real = [fc(0.2, 1.0), fc(0.4, 1.2), fc(0.3, 5.0)];
        let virt = [fc(0.9, 2.4), fc(1.2, 3.6), fc(1.5, 3.0)];
        let m = Move {
            way: "A to B",
            plain_way: "A's pod to B's pod",
            bytes: 64 << 20,
            whole: s(8.0),
            copy: Some(s(2.0)),
            plain: s(1.0),
        };
        let home = Move {
            way: "B to A (home)",
            plain_way: "B's pod to A's pod",
            ..m.clone()
        };
        let r = report(&real, &virt, &[m, home]);
        // p50 of Bound: 0.3 real, 1.2 virtual; of Running: 1.2 and 3.0.
        assert!(
            r.contains("virtual / real (p50): Bound 4.0x, Running 2.5x"),
            "{r}"
        );
        assert!(
            r.contains("move / plain copy (throughput): whole 0.12x, copy alone 0.50x"),
            "{r}"
        );
        assert!(r.contains("(3 runs each)"), "{r}");
        assert!(r.contains("MiB, B to A (home):"), "{r}");
        assert!(r.contains("plain TCP copy, B's pod to A's pod"), "{r}");
        let r = report(&real, &[], &[]);
        assert!(!r.contains("virtual / real"), "{r}");
        assert!(!r.contains("B's virtual node"), "{r}");
        assert!(!r.contains("move of"), "{r}");
    }
}
