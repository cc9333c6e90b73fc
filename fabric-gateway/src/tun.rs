//! Minimal Linux TUN device (IFF_TUN | IFF_NO_PI): one per peer.
//!
//! With IFF_VNET_HDR and TSO/checksum offload the kernel skips segmenting and
//! checksumming TCP before handing packets to us: one read returns up to 64 KiB,
//! which `offload::segment` cuts up. That turns ~45 reads into one.

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
const TUN_F_TSO_ECN: libc::c_ulong = 0x08;

#[derive(Debug)]
pub struct Tun {
    fd: OwnedFd,
    name: String,
    ifindex: u32,
    /// Every read and write carries a `virtio_net_hdr` (see `offload`).
    vnet: bool,
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Tun {
    /// Creates (or attaches to a non-persistent) TUN device called `name`,
    /// with TSO/checksum offload when `offload` is set and the kernel allows it.
    pub fn create(name: &str, offload: bool) -> io::Result<Self> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bad TUN name length",
            ));
        }
        let path = CString::new("/dev/net/tun").expect("static path");
        // Non-blocking: the reader tries a read before it polls (see `recv_timeout`).
        // SAFETY: valid NUL-terminated path; the returned fd is checked below.
        let raw = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short
                | if offload { IFF_VNET_HDR } else { 0 },
            _pad: [0; 22],
        };
        for (d, s) in req.name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: TUNSETIFF reads/writes a struct ifreq, which IfReq lays out (40 bytes).
        if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: valid C string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        if offload {
            let f = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
            // SAFETY: TUNSETOFFLOAD takes the flags by value.
            if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETOFFLOAD, f) } < 0 {
                // Still correct without offloads: the header then always says GSO_NONE.
                tracing::debug!(device = name, error = %io::Error::last_os_error(), "TUN offload unavailable");
            }
        }
        Ok(Self {
            fd,
            name: name.to_string(),
            ifindex,
            vnet: offload,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// Whether reads start with a `virtio_net_hdr` and writes must too.
    pub fn vnet_hdr(&self) -> bool {
        self.vnet
    }

    /// Reads one packet if one is queued (Ok(None) if none is: the fd is non-blocking).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: buf is valid for buf.len() bytes.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(n as usize))
    }

    /// Waits up to `timeout` for a packet. Ok(None) on timeout, so reader
    /// threads can notice a stop flag without needing a wakeup fd.
    pub fn recv_timeout(&self, buf: &mut [u8], timeout: Duration) -> io::Result<Option<usize>> {
        // Under load the next packet is usually queued already: read first and poll only
        // when the queue is empty, one syscall per read instead of a poll and a read.
        if let Some(n) = self.recv(buf)? {
            return Ok(Some(n));
        }
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as libc::c_int) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(None)
            } else {
                Err(e)
            };
        }
        if r == 0 {
            return Ok(None);
        }
        self.recv(buf)
    }

    /// Writes one complete packet (a zero `virtio_net_hdr` is prepended when needed).
    pub fn send(&self, pkt: &[u8]) -> io::Result<usize> {
        self.send_with_hdr(&[0u8; crate::offload::VNET_HDR_LEN], pkt)
    }

    /// Writes one packet with the given `virtio_net_hdr` (ignored without IFF_VNET_HDR).
    pub fn send_with_hdr(
        &self,
        hdr: &[u8; crate::offload::VNET_HDR_LEN],
        pkt: &[u8],
    ) -> io::Result<usize> {
        let iov = [
            libc::iovec {
                iov_base: hdr.as_ptr() as *mut libc::c_void,
                iov_len: hdr.len(),
            },
            libc::iovec {
                iov_base: pkt.as_ptr() as *mut libc::c_void,
                iov_len: pkt.len(),
            },
        ];
        let (iov, cnt) = if self.vnet {
            (&iov[..], 2)
        } else {
            (&iov[1..], 1)
        };
        // SAFETY: the iovecs point at live buffers of the stated lengths; the kernel only reads them.
        let n = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), cnt) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
