//! UDP segmentation and receive offloads (UDP_SEGMENT / UDP_GRO) on the
//! gateway's socket: one syscall moves up to 64 equally sized datagrams.

use std::{
    io,
    mem::{size_of, zeroed},
    net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket},
    os::fd::AsRawFd,
};

const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
/// Kernel limit on segments per UDP_SEGMENT send (UDP_MAX_SEGMENTS).
pub const MAX_SEGMENTS: usize = 64;
/// Bytes of UDP payload one GSO send may carry (64 KiB minus IP/UDP headers, IPv6 worst case).
pub const MAX_GSO_BYTES: usize = 65_535 - 48;
/// Socket buffers big enough to absorb a burst of super-packets; small defaults
/// (212 KiB) drop datagrams under load and TCP inside the tunnel then backs off.
const SOCK_BUF: libc::c_int = 8 << 20;

fn setsockopt(
    s: &UdpSocket,
    level: libc::c_int,
    opt: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    // SAFETY: v lives for the call; the size matches.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            opt,
            (&v as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Large buffers and UDP GRO. Returns whether GRO is on (then `recv` may return
/// several datagrams glued together).
pub fn tune(s: &UdpSocket) -> bool {
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        // FORCE needs CAP_NET_ADMIN, which the gateway has for its TUN devices.
        if setsockopt(s, libc::SOL_SOCKET, force, SOCK_BUF).is_err() {
            let _ = setsockopt(s, libc::SOL_SOCKET, plain, SOCK_BUF);
        }
    }
    setsockopt(s, SOL_UDP, UDP_GRO, 1).is_ok()
}

fn to_sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[repr(C)]
union CmsgBuf {
    _align: libc::cmsghdr,
    buf: [u8; 64],
}

/// Sends `buf` as datagrams of `seg` bytes each (the last may be shorter) in one
/// syscall. `seg == buf.len()` sends a single ordinary datagram.
pub fn send_segments(s: &UdpSocket, buf: &[u8], seg: usize, to: SocketAddr) -> io::Result<usize> {
    let (mut ss, sslen) = to_sockaddr(to);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = CmsgBuf { buf: [0; 64] };
    // SAFETY: all-zero is a valid msghdr; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut ss as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = sslen;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if seg < buf.len() {
        // SAFETY: cbuf has room for one cmsg carrying a u16 (CMSG_SPACE(2) <= 64).
        unsafe {
            msg.msg_control = cbuf.buf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(2) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = SOL_UDP;
            (*c).cmsg_type = UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(2) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), seg as u16);
        }
    }
    // SAFETY: msg is fully initialised and points at live buffers.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, 0) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Receives into `buf`: (bytes, sender, segment size if several datagrams were coalesced).
pub fn recv_segments(s: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, usize)> {
    // SAFETY: all-zero is valid for these plain C structs.
    let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = CmsgBuf { buf: [0; 64] };
    // SAFETY: as above.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_name = (&mut ss as *mut libc::sockaddr_storage).cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    // SAFETY: the union's bytes are plain data.
    msg.msg_control = unsafe { cbuf.buf.as_mut_ptr() }.cast();
    msg.msg_controllen = 64;
    // SAFETY: msg points at live buffers of the stated sizes.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    let mut seg = n;
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                if v > 0 {
                    seg = v as usize;
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let from = from_sockaddr(&ss)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "unknown address family"))?;
    Ok((n, from, seg))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn gso_send_and_gro_receive_on_loopback() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let gro = tune(&rx);
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let mut data = vec![0u8; 1000 * 3 + 10];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i / 1000) as u8;
        }
        let sent = match send_segments(&tx, &data, 1000, to) {
            Ok(n) => n,
            // Kernels without UDP GSO: nothing to check here.
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(sent, data.len());
        let mut got = vec![];
        let mut buf = vec![0u8; 65_536];
        while got.len() < data.len() {
            let (n, from, seg) = recv_segments(&rx, &mut buf).unwrap();
            assert_eq!(from, tx.local_addr().unwrap());
            for d in buf[..n].chunks(seg) {
                assert!(d.len() == 1000 || d.len() == 10, "datagram of {}", d.len());
                got.extend_from_slice(d);
            }
            if !gro {
                assert_eq!(seg, n);
            }
        }
        assert_eq!(got, data);
    }
}
