//! Certificates made at test time: a CA, server leaves for `127.0.0.1`/`localhost`, client
//! leaves, written as PEM files in a fresh directory under the system's temp dir.
#![allow(dead_code)]

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use std::path::{Path, PathBuf};

/// A certificate authority that signs leaves.
pub struct Ca {
    pub cert: rcgen::Certificate,
    pub key: KeyPair,
    pub pem: String,
}

/// A leaf certificate and its key, as PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        let pem = cert.pem();
        Ca { cert, key, pem }
    }

    fn leaf(&self, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
        p.distinguished_name.push(DnType::CommonName, names[0]);
        p.extended_key_usages = vec![usage];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A server certificate for `127.0.0.1` and `localhost`.
    pub fn server(&self) -> Leaf {
        self.leaf(
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A server certificate for `names` only.
    pub fn server_for(&self, names: &[&str]) -> Leaf {
        self.leaf(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate.
    pub fn client(&self, name: &str) -> Leaf {
        self.leaf(&[name], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// A fresh directory for a test's files.
pub fn dir() -> PathBuf {
    crate::common::fresh_dir("tls")
}

/// Writes `text` to `dir/name` and returns the path as a string.
pub fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    // Written beside and renamed, as a certificate manager does, so no reader sees half a file.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p.to_string_lossy().into_owned()
}

impl Leaf {
    /// Writes `name.crt` and `name.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (String, String) {
        (
            write(dir, &format!("{name}.crt"), &self.cert_pem),
            write(dir, &format!("{name}.key"), &self.key_pem),
        )
    }

    /// Certificate then key, as one PEM (reqwest's identity format).
    pub fn identity_pem(&self) -> String {
        format!("{}{}", self.cert_pem, self.key_pem)
    }
}
