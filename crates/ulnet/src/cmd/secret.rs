//! The cluster secret: where a command finds it, and what makes one usable.
//!
//! Every command that is a node or talks to one takes `--secret-file F`, or the file named
//! by `ULNET_SECRET_FILE` when the flag is absent (an empty variable is unset; flags win
//! over the environment, as everywhere). The secret is the file's bytes without trailing
//! whitespace (the newline `echo` or an editor adds), so `echo word > F` and
//! `head -c 32 /dev/urandom > F` both work.
//!
//! The rules, and why:
//! - `ulnet node` refuses to start without a secret ([`SecretError::Missing`]) unless it is
//!   given `--insecure-no-secret`: a node with the empty secret lets anyone who reaches its
//!   address join, read and write the registry, so running like that must be a choice
//!   (made on the command line, so it overrides `ULNET_SECRET_FILE`).
//! - An empty file is refused ([`SecretError::Empty`]): it is the empty secret by accident.
//! - A file other users can read or write is warned about, once per process, as ssh does
//!   for private keys, but used: the secret is shared by every node and operator of a
//!   cluster (often through a group or a shared file system), and refusing would stop
//!   clusters whose files were written with the default umask at their next restart.
//! - A client command without a secret uses the empty one, which is what a node started
//!   with `--insecure-no-secret` holds; against a node with a secret its handshake fails and
//!   [`explain_refused_handshake`] names the likely cause.
//!
//! Every [`SecretError`] ends the command with exit code 2 ([`SECRET_EXIT_CODE`]), the code
//! of a command line that cannot run as given.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The environment variable naming the secret file when `--secret-file` is absent.
pub const SECRET_FILE_ENV: &str = "ULNET_SECRET_FILE";

/// Exit code of a command refused for want of a usable secret: 2, as for a command line
/// clap refuses.
pub const SECRET_EXIT_CODE: i32 = 2;

/// How to make a secret file, for the messages that ask for one.
const HOW_TO_MAKE_ONE: &str = "make one with `head -c 32 /dev/urandom > F; chmod 600 F` and give every node and \
                               client of the cluster the same file";

/// Why a command has no usable secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Neither a secret file nor the development flag was given.
    #[error(
        "no cluster secret: pass --secret-file F ({HOW_TO_MAKE_ONE}), or set {SECRET_FILE_ENV}=F, or pass \
         --insecure-no-secret for development on one host"
    )]
    Missing,
    /// The secret file could not be read.
    #[error("reading the secret file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The secret file holds nothing but whitespace.
    #[error("the secret file {} is empty: write the cluster secret into it ({HOW_TO_MAKE_ONE})", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// The secret of `ulnet node` (and of other commands that accept connections): read from
/// `file` (`--secret-file`), else the empty secret when `insecure` (`--insecure-no-secret`)
/// says so, with a warning, else read from the file `ULNET_SECRET_FILE` names; without
/// any of them, refused.
pub fn for_server(file: Option<&Path>, insecure: bool) -> Result<Vec<u8>, SecretError> {
    if file.is_none() && insecure {
        eprintln!(
            "ulnet: warning: running without a cluster secret (--insecure-no-secret): any process that reaches \
             this command's address can connect and call it; for development on one host only"
        );
        return Ok(Vec::new());
    }
    given(file)?.ok_or(SecretError::Missing)
}

/// The secret of a client command: read from `file` (`--secret-file`), else from the file
/// `ULNET_SECRET_FILE` names, else the empty secret.
pub fn for_client(file: Option<&Path>) -> Result<Vec<u8>, SecretError> {
    Ok(given(file)?.unwrap_or_default())
}

/// The secret read from `file` (`--secret-file`), else from the file `ULNET_SECRET_FILE`
/// names (when set and not empty); `None` without either.
pub fn given(file: Option<&Path>) -> Result<Option<Vec<u8>>, SecretError> {
    let from_env = || std::env::var_os(SECRET_FILE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from);
    match file.map(Path::to_path_buf).or_else(from_env) {
        Some(path) => read_file(&path).map(Some),
        None => Ok(None),
    }
}

/// Reads the secret from `path`: its bytes without trailing whitespace; warns when other
/// users may read or write it; refuses it when empty.
pub fn read_file(path: &Path) -> Result<Vec<u8>, SecretError> {
    let read_error = |source| SecretError::Read { path: path.to_path_buf(), source };
    let mode = std::fs::metadata(path).map_err(read_error)?.mode();
    let mut secret = std::fs::read(path).map_err(read_error)?;
    secret.truncate(secret.trim_ascii_end().len());
    if secret.is_empty() {
        return Err(SecretError::Empty { path: path.to_path_buf() });
    }
    if others_may_access(mode) {
        eprintln!(
            "ulnet: warning: other users may read or write the secret file {} (mode {:03o}): whoever reads it can \
             join the cluster; restrict it with `chmod 600 {}`",
            path.display(),
            mode & 0o777,
            path.display()
        );
    }
    Ok(secret)
}

/// Whether a file of this mode may be read or written by users other than its owner: any
/// permission bit for the group or others, ssh's rule for private keys.
fn others_may_access(mode: u32) -> bool {
    mode & 0o077 != 0
}

/// A new random secret: 32 bytes from the kernel's generator.
pub fn random() -> std::io::Result<Vec<u8>> {
    let mut secret = vec![0u8; 32];
    rustix::rand::getrandom(&mut secret, rustix::rand::GetRandomFlags::empty())?;
    Ok(secret)
}

/// `bytes` as lowercase hexadecimal digits, two per byte.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `hex` spells ([`to_hex`]'s inverse); `None` when it is not an even number of
/// hexadecimal digits.
pub fn from_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok()).collect()
}

/// Writes a new [`random`] secret into `path` (in hexadecimal), which must not exist,
/// readable by its owner only; returns the secret as [`read_file`] reads it back. For
/// commands that start their own cluster (the demo).
pub fn write_new_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let hex = to_hex(&random()?);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    writeln!(f, "{hex}")?;
    Ok(read_file(path)?)
}

/// `message` (a failed command's one-line error) with the likely cause added when a peer's
/// handshake failed over the secret.
pub fn explain_refused_handshake(message: String) -> String {
    if message.contains(ulnet_core::transport::tcp::SECRET_REFUSED) {
        format!(
            "{message} (wrong or missing --secret-file: this command and the node must use the same secret file; \
             {SECRET_FILE_ENV} names it too)"
        )
    } else {
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_or_other_permissions_are_access_by_others() {
        assert!(!others_may_access(0o100600));
        assert!(!others_may_access(0o400));
        assert!(others_may_access(0o644));
        assert!(others_may_access(0o640));
        assert!(others_may_access(0o602));
    }

    #[test]
    fn trailing_whitespace_is_not_part_of_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        std::fs::write(&path, b"word \n\n").unwrap();
        assert_eq!(read_file(&path).unwrap(), b"word");
        std::fs::write(&path, b" \n\t").unwrap();
        assert!(matches!(read_file(&path), Err(SecretError::Empty { .. })));
    }

    #[test]
    fn a_new_secret_file_is_private_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let secret = write_new_file(&path).unwrap();
        assert_eq!(secret.len(), 64);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert!(write_new_file(&path).is_err(), "an existing file is never overwritten");
    }

    #[test]
    fn hex_spells_the_bytes_back() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(to_hex(&bytes), "00017f80ff");
        assert_eq!(from_hex(&to_hex(&bytes)).unwrap(), bytes);
        assert_eq!(from_hex(""), Some(Vec::new()));
        for bad in ["0", "0g", "+1", "ééé"] {
            assert_eq!(from_hex(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_refused_handshake_names_the_secret_file() {
        let refused = format!("cannot connect to x: handshake refused: {}", ulnet_core::transport::tcp::SECRET_REFUSED);
        assert!(explain_refused_handshake(refused).contains("wrong or missing --secret-file"));
        assert_eq!(explain_refused_handshake("no answer".into()), "no answer");
    }
}
