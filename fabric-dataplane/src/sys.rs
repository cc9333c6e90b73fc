//! Small kernel interfaces the loader needs: the BPF filesystem, interface facts, netns.
use std::{collections::BTreeSet, ffi::CString, io, net::Ipv4Addr, path::Path};

use crate::{Error, state::LinkFacts};

const BPF_FS_MAGIC: i64 = 0xcafe4a11;
const ARPHRD_ETHER: u16 = 1;
const ARPHRD_LOOPBACK: u16 = 772;
const ARPHRD_NONE: u16 = 0xfffe;

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Makes sure `pin_dir` exists on a BPF filesystem, mounting bpffs at /sys/fs/bpf when the
/// machine has not (as on a fresh host without systemd's mount).
pub fn ensure_pin_dir(pin_dir: &Path) -> Result<(), Error> {
    let parent = pin_dir.parent().unwrap_or(Path::new("/"));
    if !is_bpffs(parent) && !is_bpffs(pin_dir) {
        let default = Path::new("/sys/fs/bpf");
        if parent.starts_with(default) && !is_bpffs(default) {
            std::fs::create_dir_all(default).map_err(|e| Error::io("creating /sys/fs/bpf", e))?;
            let src = CString::new("bpf").unwrap();
            let dst = CString::new("/sys/fs/bpf").unwrap();
            // SAFETY: valid C strings; no data argument.
            let r = unsafe {
                libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    src.as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if r != 0 {
                return Err(Error::BpfFs(format!(
                    "/sys/fs/bpf is not a BPF filesystem and mounting one failed: {}",
                    io::Error::last_os_error()
                )));
            }
        }
        if !is_bpffs(parent) {
            return Err(Error::BpfFs(format!(
                "{} is not on a BPF filesystem (mount -t bpf bpf <dir>)",
                parent.display()
            )));
        }
    }
    std::fs::create_dir_all(pin_dir)
        .map_err(|e| Error::io(format!("creating {}", pin_dir.display()), e))
}

/// Index and header layout of a device in the current network namespace.
pub fn link_facts(name: &str) -> Result<LinkFacts, Error> {
    let err = |reason: String| Error::Interface {
        name: name.to_owned(),
        reason,
    };
    let c = CString::new(name).map_err(|_| err("name contains NUL".into()))?;
    // SAFETY: valid C string.
    let ifindex = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if ifindex == 0 {
        return Err(err("no such device in this network namespace".into()));
    }
    // SAFETY: plain socket creation.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(err(format!("socket: {}", io::Error::last_os_error())));
    }
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: ifreq is initialised with the name; the kernel fills ifru_hwaddr.
    let r = unsafe { libc::ioctl(sock, libc::SIOCGIFHWADDR, &mut ifr) };
    let e = io::Error::last_os_error();
    // SAFETY: we own the fd.
    unsafe { libc::close(sock) };
    if r != 0 {
        return Err(err(format!("SIOCGIFHWADDR: {e}")));
    }
    // SAFETY: SIOCGIFHWADDR fills the hwaddr member.
    let family = unsafe { ifr.ifr_ifru.ifru_hwaddr.sa_family };
    let l3_offset = match family {
        ARPHRD_ETHER | ARPHRD_LOOPBACK => 14,
        ARPHRD_NONE => 0,
        other => {
            return Err(err(format!(
                "unsupported link type {other} (want Ethernet or an L3 tunnel)"
            )));
        }
    };
    Ok(LinkFacts { ifindex, l3_offset })
}

/// The host's own IPv4 addresses in the current network namespace: every interface's
/// addresses and their broadcast addresses (both are delivered to the host, not forwarded).
pub fn own_ipv4_addrs() -> Result<BTreeSet<Ipv4Addr>, Error> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: valid out-pointer; freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(Error::io("listing addresses", io::Error::last_os_error()));
    }
    let v4 = |sa: *const libc::sockaddr| -> Option<Ipv4Addr> {
        // SAFETY: getifaddrs gives null or a valid sockaddr; sockaddr_in when AF_INET.
        unsafe {
            if sa.is_null() || (*sa).sa_family != libc::AF_INET as libc::sa_family_t {
                return None;
            }
            let sin = &*(sa as *const libc::sockaddr_in);
            Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        }
    };
    let mut out = BTreeSet::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        out.extend(v4(ifa.ifa_addr));
        if ifa.ifa_flags & libc::IFF_BROADCAST as libc::c_uint != 0 {
            // For IFF_BROADCAST interfaces ifa_ifu is the broadcast address.
            out.extend(v4(ifa.ifa_ifu));
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// Name of a device by index, if it exists in the current network namespace.
pub fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buffer of IF_NAMESIZE bytes as the call requires.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    String::from_utf8(bytes).ok()
}

/// Moves the calling thread into a network namespace: a name under /run/netns, or a path.
/// Call it before starting other threads, so the whole process lives there.
pub fn enter_netns(ns: &str) -> Result<(), Error> {
    Ok(fabric_netns::enter(ns)?)
}

/// Copies a string into a NUL-padded fixed buffer (truncating).
pub fn to_cbuf<const N: usize>(s: &str) -> [u8; N] {
    let mut b = [0u8; N];
    for (d, c) in b.iter_mut().take(N - 1).zip(s.bytes()) {
        *d = c;
    }
    b
}

pub fn from_cbuf(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The ids of the maps program `prog` reads, from `BPF_OBJ_GET_INFO_BY_FD` on its own fd:
/// unlike aya's `ProgramInfo::map_ids`, which opens the program again by id, this needs no
/// `CAP_SYS_ADMIN` (the gateway and the agent have `CAP_BPF` and `CAP_NET_ADMIN`).
#[cfg(feature = "programs")]
pub(crate) fn prog_map_ids(prog: std::os::fd::BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;

    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    // struct bpf_prog_info up to its map_ids: nr_map_ids at byte 52, map_ids at byte 56.
    const INFO_LEN: usize = 64;
    const NR_MAP_IDS: usize = 52;
    const MAP_IDS: usize = 56;
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let get = |info: &mut [u8; INFO_LEN]| -> io::Result<()> {
        let attr = InfoAttr {
            bpf_fd: prog.as_raw_fd() as u32,
            info_len: INFO_LEN as u32,
            info: info.as_mut_ptr() as u64,
        };
        // SAFETY: `attr` points at `info`, INFO_LEN bytes the kernel may write, and its
        // map_ids field (when set) at a buffer of nr_map_ids u32s that outlives the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_OBJ_GET_INFO_BY_FD,
                &attr as *const InfoAttr,
                std::mem::size_of::<InfoAttr>(),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    let mut info = [0u8; INFO_LEN];
    get(&mut info)?;
    let n = u32::from_ne_bytes(
        info[NR_MAP_IDS..NR_MAP_IDS + 4]
            .try_into()
            .expect("4 bytes"),
    );
    let mut ids = vec![0u32; n as usize];
    let mut info = [0u8; INFO_LEN];
    info[NR_MAP_IDS..NR_MAP_IDS + 4].copy_from_slice(&n.to_ne_bytes());
    info[MAP_IDS..MAP_IDS + 8].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    get(&mut info)?;
    // A program's maps are fixed at load: the count cannot have grown in between.
    let written = u32::from_ne_bytes(
        info[NR_MAP_IDS..NR_MAP_IDS + 4]
            .try_into()
            .expect("4 bytes"),
    );
    ids.truncate(written.min(n) as usize);
    Ok(ids)
}
