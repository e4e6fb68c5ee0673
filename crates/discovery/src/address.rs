//! URL and ZMQ address formatting for an IP and port (IPv6 bracketed), shared by the sources.

use std::net::{IpAddr, SocketAddr};

/// `ip:port`, IPv6 in brackets.
pub fn host_port(ip: IpAddr, port: u16) -> String {
    SocketAddr::new(ip, port).to_string()
}

/// `http://ip:port`.
pub fn http_url(ip: IpAddr, port: u16) -> String {
    format!("http://{}", host_port(ip, port))
}

/// `tcp://ip:port`, the ZMQ endpoint form.
pub fn tcp_url(ip: IpAddr, port: u16) -> String {
    format!("tcp://{}", host_port(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_is_bracketed() {
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(http_url(v6, 8000), "http://[fd00::1]:8000");
        assert_eq!(
            tcp_url("10.0.0.1".parse().unwrap(), 5557),
            "tcp://10.0.0.1:5557"
        );
    }
}
