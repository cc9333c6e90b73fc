//! Discovery over real packets, inside namespaces this test creates.
//!
//! - LAN: three clusters' namespaces on one bridge announce themselves over mDNS and browse;
//!   each finds the two others and not itself, a withdrawn announcement is noticed, and a
//!   hostile responder on the same bridge (announcing records fabric-discovery would never
//!   write: an http:// URL, a future version, a name that is not its id, bytes that are not
//!   UTF-8) is ignored with a log line while the good clusters still show.
//! - DNS: dnsmasq in a namespace publishes two clusters, this cluster and a malformed record
//!   under `example.test`; the resolver finds the two good ones, and later resolutions follow
//!   the domain as its records change.
use std::{
    collections::BTreeSet,
    io::Write,
    sync::{Mutex, Once},
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use fabric_discovery::{
    Announcement, Change, ClusterId, Role,
    dns::{DnsBrowser, DnsConfig},
    mdns::{DOMAIN, Lan},
};
use fabric_netns::testbed::{Bg, join, spawn_in_netns};
use fabric_tests::{Testbed, skip_unless_root};
use mdns_sd::{ServiceDaemon, ServiceInfo, TxtProperty};

/// What the process logged (every test's `tracing` output), to check rejections are logged.
static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        LOG.lock().unwrap().extend_from_slice(b);
        std::io::stderr().write(b)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        tracing_subscriber::fmt()
            .with_writer(|| LogWriter)
            .with_ansi(false)
            .init();
    });
}

fn logs() -> String {
    String::from_utf8_lossy(&LOG.lock().unwrap()).into_owned()
}

fn id(s: &str) -> ClusterId {
    s.parse().unwrap()
}

fn announcement(cluster: &str, port: u16) -> Announcement {
    Announcement {
        cluster_id: id(cluster),
        auth_url: format!("https://auth.{cluster}.example.test:{port}/fabric")
            .parse()
            .unwrap(),
        roles: BTreeSet::from([Role::Provider]),
    }
}

fn cluster_of(c: &Change) -> &str {
    match c {
        Change::Discovered(a) | Change::Updated(a) => a.cluster_id.as_str(),
        Change::Expired(id) => id.as_str(),
    }
}

/// Waits until `done` holds for what `rx` delivered so far (collected in `seen`).
async fn wait_until<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    seen: &mut Vec<T>,
    within: Duration,
    what: &str,
    done: impl Fn(&[T]) -> bool,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + within;
    while !done(seen) {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(x)) => seen.push(x),
            Ok(None) => bail!("the browsers stopped before {what}"),
            Err(_) => bail!("no {what} within {within:?}"),
        }
    }
    Ok(())
}

/// Records a hostile responder announces, each with the error it must be refused with.
fn hostile_services() -> Vec<(&'static str, Vec<TxtProperty>, &'static str)> {
    let p = |k: &str, v: &[u8]| TxtProperty::from((k, v));
    vec![
        (
            "evil-http",
            vec![
                p("txtvers", b"1"),
                p("id", b"evil-http"),
                p("auth", b"http://auth.evil.example.test"),
            ],
            "not https://",
        ),
        (
            "evil-future",
            vec![
                p("txtvers", b"7"),
                p("id", b"evil-future"),
                p("auth", b"https://auth.evil.example.test"),
            ],
            "protocol version 7 is not supported",
        ),
        (
            "evil-spoof",
            vec![
                p("txtvers", b"1"),
                p("id", b"a"),
                p("auth", b"https://auth.evil.example.test"),
            ],
            "must be equal",
        ),
        (
            "evil-bytes",
            vec![
                p("txtvers", b"1"),
                p("id", b"evil-bytes"),
                p("auth", b"https://\xff\xfe.example.test"),
            ],
            "is not UTF-8",
        ),
        (
            "evil-missing",
            vec![p("txtvers", b"1"), p("id", b"evil-missing")],
            "\"auth\" is missing",
        ),
    ]
}

#[test]
fn lan_clusters_find_each_other_and_ignore_hostile_announcements() -> Result<()> {
    if skip_unless_root("lan_clusters_find_each_other_and_ignore_hostile_announcements") {
        return Ok(());
    }
    capture_logs();
    let mut tb = Testbed::new()?;
    let lan = tb.add_netns("lan")?;
    tb.bridge(&lan, "br0")?;
    let mut ns = Vec::new();
    for (i, name) in ["a", "b", "c", "evil"].into_iter().enumerate() {
        let n = tb.add_netns(name)?;
        let port = format!("p{name}");
        tb.veth(&n, "eth0", &lan, &port)?;
        tb.ip(&lan, &["link", "set", &port, "master", "br0"])?;
        tb.ip(
            &n,
            &[
                "addr",
                "add",
                &format!("10.99.0.{}/24", i + 1),
                "dev",
                "eth0",
            ],
        )?;
        tb.ip(&n, &["route", "add", "224.0.0.0/4", "dev", "eth0"])?;
        ns.push(n);
    }

    // The responders' threads live in their namespaces; their handles work from anywhere.
    let hostile = {
        let evil = ns[3].clone();
        join(spawn_in_netns(&evil, || {
            let d = ServiceDaemon::new().context("starting the hostile responder")?;
            for (instance, txt, _) in hostile_services() {
                let info = ServiceInfo::new(
                    &format!("_fabric-peering._tcp.{DOMAIN}"),
                    instance,
                    "evil.local.",
                    "",
                    443,
                    txt,
                )?
                .enable_addr_auto();
                d.register(info)?;
            }
            Ok(d)
        }))?
    };
    let names = ["a", "b", "c"];
    let mut lans = Vec::new();
    for (n, name) in ns.iter().zip(names) {
        lans.push(join(spawn_in_netns(n, || Ok(Lan::new()?)))?);
        lans.last().unwrap().announce(&announcement(name, 8443))?;
    }

    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(async {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for (lan, name) in lans.iter().zip(names) {
            let mut browser = lan.browse(Some(id(name)))?;
            let tx = tx.clone();
            tokio::spawn(async move {
                while let Some(c) = browser.next().await {
                    if tx.send((name, c)).is_err() {
                        break;
                    }
                }
            });
        }
        let mut seen: Vec<(&str, Change)> = Vec::new();
        let discovered = |seen: &[(&str, Change)], who: &str, whom: &str| {
            seen.iter().any(|(w, c)| {
                *w == who && matches!(c, Change::Discovered(a) if a == &announcement(whom, 8443))
            })
        };
        let everyone_found = |seen: &[(&str, Change)]| {
            names.iter().all(|who| {
                names
                    .iter()
                    .filter(|o| *o != who)
                    .all(|whom| discovered(seen, who, whom))
            })
        };
        wait_until(
            &mut rx,
            &mut seen,
            Duration::from_secs(30),
            "discovery of all by all",
            everyone_found,
        )
        .await?;
        // Every browser has seen (and refused) every hostile record.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let log = logs();
            let missing: Vec<_> = hostile_services()
                .into_iter()
                .filter(|(instance, _, why)| {
                    log.lines()
                        .filter(|l| {
                            l.contains("ignoring a cluster announcement")
                                && l.contains(&format!("\"{instance}\""))
                                && l.contains(why)
                        })
                        .count()
                        < names.len()
                })
                .map(|(i, _, _)| i)
                .collect();
            if missing.is_empty() {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                bail!("not every browser logged refusing {missing:?}:\n{log}");
            }
            // Keep collecting meanwhile: nothing hostile may show up as a change.
            let _ = tokio::time::timeout(Duration::from_millis(200), async {
                while let Some(x) = rx.recv().await {
                    seen.push(x);
                }
            })
            .await;
        }

        // c withdraws: a and b notice.
        lans[2].withdraw(&id("c")).await?;
        let expired = |seen: &[(&str, Change)], who: &str| {
            seen.iter()
                .any(|(w, c)| *w == who && *c == Change::Expired(id("c")))
        };
        wait_until(
            &mut rx,
            &mut seen,
            Duration::from_secs(15),
            "expiry of c at a and b",
            |s| expired(s, "a") && expired(s, "b"),
        )
        .await?;
        Ok::<_, anyhow::Error>(seen)
    });
    let _ = hostile.shutdown();
    let seen = result?;
    for (who, c) in &seen {
        let whom = cluster_of(c);
        assert_ne!(*who, whom, "{who} saw itself: {c:?}");
        assert!(names.contains(&whom), "{who} took a hostile record: {c:?}");
        assert!(
            !matches!(c, Change::Updated(_)),
            "{who}: nothing changed: {c:?}"
        );
    }
    Ok(())
}

/// dnsmasq's configuration publishing `instances` (name, SRV port, TXT strings) under
/// `_fabric-peering._tcp.example.test`, answering on `listen`:53 only.
fn dnsmasq_conf(listen: &str, instances: &[(&str, u16, Vec<String>)]) -> String {
    let service = "_fabric-peering._tcp.example.test";
    let mut conf = format!(
        "listen-address={listen}\nbind-interfaces\nno-resolv\nno-hosts\nno-negcache\nlocal=/example.test/\n"
    );
    for (instance, port, txt) in instances {
        let quoted: Vec<String> = txt.iter().map(|s| format!("\"{s}\"")).collect();
        conf += &format!("ptr-record={service},{instance}.{service}\n");
        conf += &format!("srv-host={instance}.{service},auth.{instance}.example.test,{port}\n");
        conf += &format!("txt-record={instance}.{service},{}\n", quoted.join(","));
    }
    conf
}

/// Whether dnsmasq is installed (`cargo xtask setup` installs it; CI must have it).
fn have_dnsmasq(test: &str) -> bool {
    let found = std::process::Command::new("sh")
        .args(["-c", "command -v dnsmasq"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test}: dnsmasq is missing in CI"
        );
        eprintln!("SKIPPED {test}: dnsmasq not installed (cargo xtask setup installs it)");
    }
    found
}

/// Starts dnsmasq in `ns` with configuration `conf` (written to scratch file `file`).
fn dnsmasq(tb: &mut Testbed, ns: &str, file: &str, conf: &str) -> Result<Bg> {
    let path = tb.write_file(file, conf)?;
    tb.spawn(
        ns,
        &[
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            &format!("--conf-file={}", path.display()),
            "--pid-file=",
            "--user=root",
            "--log-facility=-",
        ],
    )
}

fn good_txt(cluster: &str, port: u16) -> Vec<String> {
    announcement(cluster, port)
        .to_txt_strings()
        .into_iter()
        .map(|s| String::from_utf8(s).unwrap())
        .collect()
}

#[test]
fn dns_sd_records_under_a_domain_are_found_and_followed() -> Result<()> {
    let test = "dns_sd_records_under_a_domain_are_found_and_followed";
    if skip_unless_root(test) || !have_dnsmasq(test) {
        return Ok(());
    }
    capture_logs();
    let mut tb = Testbed::new()?;
    let server = tb.add_netns("dns")?;
    let client = tb.add_netns("me")?;
    tb.veth_addrs(
        (&server, "eth0", "10.98.0.1/24"),
        (&client, "eth0", "10.98.0.2/24"),
    )?;
    let dnsmasq = |tb: &mut Testbed, file: &str, conf: String| dnsmasq(tb, &server, file, &conf);
    let bad = vec![
        "txtvers=1".to_owned(),
        "id=mallory".to_owned(),
        "id=a".to_owned(),
        "auth=http://auth.mallory.example.test".to_owned(),
    ];
    let first = vec![
        ("a", 8443, good_txt("a", 8443)),
        ("b", 443, good_txt("b", 443)),
        ("me", 443, good_txt("me", 443)),
        ("mallory", 443, bad.clone()),
    ];
    let mut dns = dnsmasq(&mut tb, "dnsmasq-1.conf", dnsmasq_conf("10.98.0.1", &first))?;

    let config = DnsConfig {
        domain: "example.test".into(),
        nameserver: Some("10.98.0.1:53".parse()?),
        interval: Duration::from_millis(300),
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (back, changes) = std::sync::mpsc::channel::<Vec<Change>>();
    // The resolver's sockets are made where its runtime runs: inside the client namespace.
    let browsing = spawn_in_netns(&client, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(async {
            let mut browser = DnsBrowser::new(&config, Some(id("me")))?;
            // The server may still be starting.
            let mut tries = 0;
            let first = loop {
                match browser.poll().await {
                    Ok(c) => break c,
                    Err(e) if tries < 20 => {
                        tries += 1;
                        eprintln!("not yet: {e}");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(e) => return Err(e.into()),
                }
            };
            back.send(first)?;
            // After each restart of the server: once by polling, once by the browser's loop.
            rx.recv()?;
            back.send(browser.poll().await?)?;
            rx.recv()?;
            let next = tokio::time::timeout(Duration::from_secs(10), browser.next())
                .await
                .context("no change from the periodic resolution")?;
            back.send(vec![next])?;
            Ok::<_, anyhow::Error>(())
        })
    });
    let recv = || {
        changes
            .recv_timeout(Duration::from_secs(30))
            .context("the browser thread ended")
    };
    let as_set = |v: Vec<Change>| {
        v.into_iter()
            .map(|c| format!("{c:?}"))
            .collect::<BTreeSet<_>>()
    };
    let expect = |v: Vec<Change>| as_set(v);

    let got = recv()?;
    assert_eq!(
        as_set(got),
        expect(vec![
            Change::Discovered(announcement("a", 8443)),
            Change::Discovered(announcement("b", 443)),
        ])
    );
    let log = logs();
    assert!(
        log.lines()
            .any(|l| l.contains("ignoring a cluster announcement")
                && l.contains("\"mallory\"")
                && l.contains("appears more than once")),
        "mallory's record refused with a log line:\n{log}"
    );

    // a moves its authentication service, b leaves.
    drop(dns);
    let second = vec![
        ("a", 9443, good_txt("a", 9443)),
        ("me", 443, good_txt("me", 443)),
        ("mallory", 443, bad),
    ];
    dns = dnsmasq(
        &mut tb,
        "dnsmasq-2.conf",
        dnsmasq_conf("10.98.0.1", &second),
    )?;
    std::thread::sleep(Duration::from_millis(500));
    tx.send(())?;
    assert_eq!(
        as_set(recv()?),
        expect(vec![
            Change::Updated(announcement("a", 9443)),
            Change::Expired(id("b")),
        ])
    );

    // b comes back: the periodic resolution finds it.
    drop(dns);
    let third = vec![
        ("a", 9443, good_txt("a", 9443)),
        ("b", 443, good_txt("b", 443)),
    ];
    let _dns = dnsmasq(&mut tb, "dnsmasq-3.conf", dnsmasq_conf("10.98.0.1", &third))?;
    std::thread::sleep(Duration::from_millis(500));
    tx.send(())?;
    assert_eq!(recv()?, vec![Change::Discovered(announcement("b", 443))]);
    join(browsing)?;
    Ok(())
}

/// A ForeignCluster's name and spec.
type Named = (String, serde_json::Value);

/// The discovery controller (`fabric-controller ipam --discovery-domain --discovery-mdns
/// --announce-auth-url`) against a test API server: clusters published under the domain
/// become ForeignClusters with `discoveredBy: Dns`, one announced on the LAN with
/// `discoveredBy: Lan`, each with its authentication URL; a ForeignCluster made by hand is left
/// alone; the LAN hears the controller's own announcement; a cluster the domain stops
/// publishing, or that withdraws from the LAN, loses its ForeignCluster.
#[test]
fn the_controller_makes_foreign_clusters_of_what_it_discovers() -> Result<()> {
    let test = "the_controller_makes_foreign_clusters_of_what_it_discovers";
    if skip_unless_root(test)
        || !fabric_tests::apiserver::require_tools(test)
        || !have_dnsmasq(test)
    {
        return Ok(());
    }
    let mut tb = Testbed::new()?;
    // One namespace stands for the cluster: its API server, the controller, and (on another
    // address) the DNS server of its search domain.
    let ns = tb.add_netns("cluster")?;
    tb.ip(&ns, &["addr", "add", "10.98.0.1/32", "dev", "lo"])?;
    tb.ip(&ns, &["addr", "add", "10.98.0.53/32", "dev", "lo"])?;
    // Cluster c, on the same LAN.
    let lan_peer = tb.add_netns("c")?;
    tb.veth_addrs(
        (&ns, "eth0", "10.97.0.1/24"),
        (&lan_peer, "eth0", "10.97.0.3/24"),
    )?;
    for n in [&ns, &lan_peer] {
        tb.ip(n, &["route", "add", "224.0.0.0/4", "dev", "eth0"])?;
    }
    let c = join(spawn_in_netns(&lan_peer, || Ok(Lan::new()?)))?;
    c.announce(&announcement("c", 443))?;
    let api = fabric_tests::apiserver::ApiServer::start_in_netns("discovery", &ns, "10.98.0.1")?;
    api.install_crds();
    api.kubectl_ok(&["create", "namespace", "fabric-system"]);
    api.kubectl_stdin(
        &["apply", "-f", "-"],
        "apiVersion: core.fabric.io/v1alpha1\nkind: ForeignCluster\nmetadata: {name: peer-b}\n\
         spec: {clusterId: b, discoveredBy: Manual, authUrl: \"https://by-hand.example.test\"}\n",
    );

    let published = vec![
        ("a", 8443, good_txt("a", 8443)),
        ("b", 443, good_txt("b", 443)),
        ("me", 443, good_txt("me", 443)),
        (
            "mallory",
            443,
            vec![
                "txtvers=1".into(),
                "id=mallory".into(),
                "auth=http://x.example.test".into(),
            ],
        ),
    ];
    let mut dns = dnsmasq(
        &mut tb,
        &ns,
        "zone-1.conf",
        &dnsmasq_conf("10.98.0.53", &published),
    )?;
    let controller = fabric_tests::locate_bin("fabric-controller")?;
    let kubeconfig = format!("KUBECONFIG={}", api.in_cluster_kubeconfig.display());
    let _controller = tb.spawn(
        &ns,
        &[
            "env",
            &kubeconfig,
            "POD_NAME=controller-0",
            &controller.display().to_string(),
            "ipam",
            "--pod-cidr=10.244.0.0/16",
            "--service-cidr=10.96.0.0/16",
            "--external-cidr=10.70.0.0/16",
            "--cluster-id=me",
            "--discovery-domain=example.test",
            "--discovery-nameserver=10.98.0.53:53",
            "--discovery-interval=1s",
            "--discovery-mdns",
            "--announce-auth-url=https://auth.me.example.test",
            "--announce-roles=provider,consumer",
        ],
    )?;
    let rt = tokio::runtime::Runtime::new()?;
    let mut heard = c.browse(Some(id("c")))?;

    let foreign_clusters = || -> Result<Vec<Named>> {
        let out = api.kubectl_ok(&["get", "foreignclusters", "-o", "json"]);
        let list: serde_json::Value = serde_json::from_str(&out)?;
        let mut items: Vec<(String, serde_json::Value)> = list["items"]
            .as_array()
            .context("items")?
            .iter()
            .map(|i| {
                (
                    i["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    i["spec"].clone(),
                )
            })
            .collect();
        items.sort_by(|x, y| x.0.cmp(&y.0));
        Ok(items)
    };
    let wait_for = |what: &str, done: &dyn Fn(&[Named]) -> bool| -> Result<()> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let fcs = foreign_clusters()?;
            if done(&fcs) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                bail!("{what}: ForeignClusters are {fcs:#?}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    };
    let a_spec = serde_json::json!({
        "clusterId": "a",
        "discoveredBy": "Dns",
        "authUrl": "https://auth.a.example.test:8443/fabric",
        "role": "Unknown",
    });
    let by_hand = serde_json::json!({
        "clusterId": "b",
        "discoveredBy": "Manual",
        "authUrl": "https://by-hand.example.test",
        "role": "Unknown",
    });
    let with_role = |mut v: serde_json::Value| {
        // The API server returns what was written: role only when someone wrote one.
        v.as_object_mut().unwrap().remove("role");
        v
    };
    let same = |got: &serde_json::Value, want: &serde_json::Value| {
        got == want || *got == with_role(want.clone())
    };
    let c_spec = serde_json::json!({
        "clusterId": "c",
        "discoveredBy": "Lan",
        "authUrl": "https://auth.c.example.test:443/fabric",
        "role": "Unknown",
    });
    wait_for("a and c discovered", &|fcs| {
        fcs.len() == 3
            && fcs[0].0 == "a"
            && same(&fcs[0].1, &a_spec)
            && fcs[1].0 == "c"
            && same(&fcs[1].1, &c_spec)
            && fcs[2].0 == "peer-b"
            && same(&fcs[2].1, &by_hand)
    })?;
    // c hears the controller announce this cluster.
    let me =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), heard.next()).await })?;
    assert_eq!(
        me,
        Some(Change::Discovered(Announcement {
            cluster_id: id("me"),
            auth_url: "https://auth.me.example.test".parse()?,
            roles: BTreeSet::from([Role::Consumer, Role::Provider]),
        }))
    );
    // A few resolutions later, still nothing more: not this cluster, not mallory, not a second b.
    std::thread::sleep(Duration::from_secs(3));
    let fcs = foreign_clusters()?;
    assert_eq!(
        fcs.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
        ["a", "c", "peer-b"]
    );

    // The domain stops publishing a (and b): a's ForeignCluster goes, the one made by hand stays.
    drop(dns);
    dns = dnsmasq(
        &mut tb,
        &ns,
        "zone-2.conf",
        &dnsmasq_conf("10.98.0.53", &published[2..]),
    )?;
    wait_for("a gone", &|fcs| {
        fcs.len() == 2 && fcs[0].0 == "c" && fcs[1].0 == "peer-b" && same(&fcs[1].1, &by_hand)
    })?;
    // c leaves the LAN.
    rt.block_on(c.withdraw(&id("c")))?;
    wait_for("c gone", &|fcs| {
        fcs.len() == 1 && fcs[0].0 == "peer-b" && same(&fcs[0].1, &by_hand)
    })?;
    drop(dns);
    Ok(())
}
