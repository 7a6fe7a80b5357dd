//! Where `deltamem serve` listens: a TCP address, or a Unix socket
//! (`unix:PATH`) for clients on the same machine.
//!
//! Why a Unix socket: agents on one machine (a research run's workers, an
//! IDE's sessions) reach the server without a TCP port that every local
//! user can connect to. The socket file is made owner-only (mode 0600), so
//! the filesystem is the access control and no token is needed; a request
//! also skips the kernel's TCP/IP path (measured: about 16% less CPU an
//! insert than loopback TCP on the same machine, docs/SERVER.md).

use std::fmt;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use super::ServeError;

/// A listening address as given to `--listen` (and, once bound, with the
/// port the OS chose).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl ListenAddr {
    /// Whether serving here without a bearer token is safe: a loopback
    /// address, or an owner-only Unix socket.
    pub fn is_local(&self) -> bool {
        match self {
            ListenAddr::Tcp(addr) => super::http::is_loopback(addr),
            ListenAddr::Unix(_) => true,
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<ListenAddr, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            return match path.is_empty() {
                true => Err("unix: needs the socket's path (unix:/run/user/1000/deltamem.sock)".into()),
                false => Ok(ListenAddr::Unix(PathBuf::from(path))),
            };
        }
        text.parse()
            .map(ListenAddr::Tcp)
            .map_err(|_| format!("{text:?} is neither an address with a port (127.0.0.1:7878) nor unix:PATH"))
    }
}

/// `http://ADDR` for TCP (what scripts read the port from), `unix:PATH`.
impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Tcp(addr) => write!(f, "http://{addr}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A bound Unix socket: the file is removed when this is dropped (when
/// the server stops accepting, as a TCP listener closes its port then), if
/// it is still the one bound here (another server may have replaced it).
pub struct UnixSocket {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    inode: u64,
}

impl super::listen::Accept for UnixSocket {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        self.listener.accept().await.map(|(stream, _)| stream)
    }
}

impl Drop for UnixSocket {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds a Unix socket at `path`, owner-only. A socket file already there
/// is replaced only if nothing answers on it (a server that was killed
/// leaves one behind); anything else at the path is left alone and refused.
pub fn bind_unix(path: &Path) -> Result<UnixSocket, ServeError> {
    let shown = path.display();
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ServeError::Config(format!(
                "{shown} exists and is not a socket: refusing to replace it"
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::Config(format!("another server is listening on {shown}")));
        }
        std::fs::remove_file(path).map_err(super::io(format!("cannot remove the stale socket {shown}")))?;
    }
    let listener = tokio::net::UnixListener::bind(path).map_err(super::io(format!("cannot listen on {shown}")))?;
    // Created as 0777 less the umask: narrowed before the first accept.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(super::io(format!("cannot make {shown} owner-only")))?;
    let inode = std::fs::symlink_metadata(path)
        .map_err(super::io(format!("cannot read {shown}")))?
        .ino();
    Ok(UnixSocket {
        listener,
        path: path.to_path_buf(),
        inode,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_tcp_or_unix_and_says_which() {
        let tcp: ListenAddr = "127.0.0.1:7878".parse().unwrap();
        assert_eq!(tcp.to_string(), "http://127.0.0.1:7878");
        assert!(tcp.is_local());
        let public: ListenAddr = "0.0.0.0:80".parse().unwrap();
        assert!(!public.is_local());
        let unix: ListenAddr = "unix:/tmp/d.sock".parse().unwrap();
        assert_eq!(unix, ListenAddr::Unix("/tmp/d.sock".into()));
        assert_eq!(unix.to_string(), "unix:/tmp/d.sock");
        assert!(unix.is_local());
        for bad in ["unix:", "localhost", "127.0.0.1", "/tmp/d.sock"] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad}");
        }
    }
}
