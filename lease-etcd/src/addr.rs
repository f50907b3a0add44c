//! The authority address `etcd://host:port[,host:port...]/prefix`.

use crate::error::EtcdError;

/// A parsed `etcd://host:port[,host:port...]/prefix` address: the cluster's client
/// endpoints and the key prefix under which every run of this deployment lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityAddr {
    /// Client endpoints as gRPC URLs (`http://host:port`).
    pub endpoints: Vec<String>,
    /// The key prefix (one or more `/`-separated segments of `[A-Za-z0-9._-]`, none of them
    /// `.` or `..`), without leading or trailing `/`.
    pub prefix: String,
}

impl AuthorityAddr {
    /// Parse an address. Plaintext gRPC only (this build has no TLS).
    pub fn parse(value: &str) -> Result<AuthorityAddr, EtcdError> {
        let bad = |reason: &str| EtcdError::AuthorityInvalid {
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let rest = value
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("must start with etcd://"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| bad("a key prefix is required: etcd://host:port/prefix"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() {
            return Err(bad("the key prefix is empty"));
        }
        for seg in prefix.split('/') {
            if seg.is_empty()
                || seg == "."
                || seg == ".."
                || !seg
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
            {
                return Err(bad(
                    "prefix segments must be non-empty [A-Za-z0-9._-], not . or ..",
                ));
            }
        }
        let mut endpoints = Vec::new();
        for hp in hosts.split(',') {
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| bad("every endpoint needs host:port"))?;
            let host_ok = if let Some(v6) = host.strip_prefix('[') {
                v6.strip_suffix(']')
                    .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
            } else {
                !host.is_empty()
                    && host
                        .bytes()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-'))
            };
            if !host_ok {
                return Err(bad("an endpoint host is not a host name or address"));
            }
            match port.parse::<u16>() {
                Ok(p) if p > 0 && port == p.to_string() => {}
                _ => return Err(bad("an endpoint port is not a number in 1..=65535")),
            }
            endpoints.push(format!("http://{host}:{port}"));
        }
        Ok(AuthorityAddr {
            endpoints,
            prefix: prefix.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_bad_ones_are_refused() {
        let a = AuthorityAddr::parse("etcd://127.0.0.1:2379,node-2.example:2379/runlease/prod/")
            .unwrap();
        assert_eq!(
            a.endpoints,
            ["http://127.0.0.1:2379", "http://node-2.example:2379"]
        );
        assert_eq!(a.prefix, "runlease/prod");
        let v6 = AuthorityAddr::parse("etcd://[::1]:2379/p").unwrap();
        assert_eq!(v6.endpoints, ["http://[::1]:2379"]);
        for bad in [
            "http://127.0.0.1:2379/p",
            "etcd://127.0.0.1:2379",
            "etcd://127.0.0.1:2379/",
            "etcd://127.0.0.1/p",
            "etcd://127.0.0.1:0/p",
            "etcd://127.0.0.1:02379/p",
            "etcd://127.0.0.1:2379/a/../b",
            "etcd://127.0.0.1:2379/a b",
            "etcd://:2379/p",
            "etcd://h@x:2379/p",
            "etcd://[zz]:2379/p",
        ] {
            let e = AuthorityAddr::parse(bad).unwrap_err();
            assert_eq!(e.code().as_str(), "AUTHORITY_INVALID", "{bad}");
        }
    }
}
