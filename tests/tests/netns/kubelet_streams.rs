//! `kubectl exec` and `kubectl port-forward` through the API server to a test node, whose
//! kubelet API serves them over SPDY (`fabric-kubelet`): output, exit codes, stdin, stderr, a
//! failing command, attach refused with a reason, and a connection forwarded to a pod's port.
//! One cluster of the fixture is enough (no peering).
use std::{
    io::{BufRead as _, BufReader, Read as _},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use fabric_tests::{
    ChildGuard,
    apiserver::require_tools,
    clusters::PeeredClusters,
    skip_unless_root,
    workloads::{ECHO_PORT, echo_pod},
};

const T: Duration = Duration::from_secs(20);

#[test]
fn exec_and_port_forward_through_kubectl() {
    if skip_unless_root("exec_and_port_forward_through_kubectl")
        || !require_tools("exec_and_port_forward_through_kubectl")
    {
        return;
    }
    let t0 = Instant::now();
    let cl = PeeredClusters::new(1).unwrap();
    cl.a.create_pod(&echo_pod("echo")).unwrap();
    let e = cl.a.wait_pod_running("default", "echo", T).unwrap();
    eprintln!("pod running after {:?}", t0.elapsed());
    let api = &cl.a.api;

    // The command runs in the pod's network namespace: it sees the pod's address.
    let out = api.kubectl_ok(&[
        "exec", "echo", "--", "ip", "-o", "-4", "addr", "show", "dev", "eth0",
    ]);
    assert!(out.contains(&format!("inet {}/32", e.ip)), "{out}");

    // Exit codes come back through the status on the error stream.
    let o = api.kubectl(&[
        "exec",
        "echo",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "out\n");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("err\n"),
        "{o:?}"
    );

    // Stdin, more than one SPDY frame of it.
    let input: String = (0..5000).map(|i| format!("line {i}\n")).collect();
    let o = api.kubectl_stdin(&["exec", "-i", "echo", "--", "cat"], &input);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), input);
    let o = api.kubectl_stdin(&["exec", "-i", "echo", "--", "wc", "-l"], &input);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "5000");

    // A command that does not exist fails, and says so.
    let o = api.kubectl(&["exec", "echo", "--", "no-such-command-here"]);
    assert!(!o.status.success(), "{o:?}");

    // Attach: refused with the reason.
    let o = api.kubectl(&["attach", "echo"]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("keeps no stdio"),
        "{o:?}"
    );

    // Port-forward to the echo server: it sees the connection from inside the pod.
    let mut pf = ChildGuard(
        fabric_tests::die_with_parent(&mut Command::new("kubectl"))
            .env("KUBECONFIG", &api.kubeconfig)
            .args(["port-forward", "pod/echo", &format!(":{ECHO_PORT}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(pf.0.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // "Forwarding from 127.0.0.1:PORT -> 8080"
    let local: u16 = first
        .split_once("127.0.0.1:")
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{first}"));
    for _ in 0..2 {
        let mut s = TcpStream::connect(("127.0.0.1", local)).unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("127.0.0.1:"), "{answer:?}");
    }
    drop(pf);
    eprintln!("done after {:?}", t0.elapsed());
}
