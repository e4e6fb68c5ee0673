//! The `dns` source reading SRV records through its real DNS client, against a DNS server in
//! this test (UDP on 127.0.0.1:0) that answers as a Kubernetes zone does for a headless
//! Service's named port: one SRV record per pod, each pod's address beside the answer, or (for
//! one pod here) only on its own A query. No fixed sleeps: each step waits for the next
//! published set, with a deadline.

use hickory_resolver::proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, SRV};
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use kvgate_discovery::{
    DiscoveryConfig, DnsRecord, DnsSource, EndpointSet, Source, SourceKind, SystemResolver,
};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UdpSocket;
use tokio::sync::watch;

const SERVICE: &str = "_http._tcp.vllm.inference.svc.test.";

/// The zone: (pod name, address, port, address given beside the SRV answer); `None` answers
/// SERVFAIL.
type Zone = Arc<Mutex<Option<Vec<(&'static str, Ipv4Addr, u16, bool)>>>>;

fn answer(query: &Message, zone: &Zone) -> Message {
    let mut m = Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = query.metadata.recursion_desired;
    m.metadata.recursion_available = true;
    m.metadata.authoritative = true;
    let Some(q) = query.queries.first() else {
        m.metadata.response_code = ResponseCode::FormErr;
        return m;
    };
    m.add_query(q.clone());
    let Some(pods) = zone.lock().unwrap().clone() else {
        m.metadata.response_code = ResponseCode::ServFail;
        return m;
    };
    let name = q.name().to_ascii();
    let a = |pod: &str, ip: Ipv4Addr| {
        Record::from_rdata(Name::from_ascii(pod).unwrap(), 5, RData::A(A(ip)))
    };
    match q.query_type() {
        RecordType::SRV if name == SERVICE => {
            for (pod, ip, port, beside) in &pods {
                let target = Name::from_ascii(pod).unwrap();
                let srv = SRV::new(0, 50, *port, target);
                m.add_answer(Record::from_rdata(q.name().clone(), 5, RData::SRV(srv)));
                if *beside {
                    m.add_additional(a(pod, *ip));
                }
            }
        }
        RecordType::A => match pods.iter().find(|(pod, ..)| *pod == name) {
            Some((pod, ip, ..)) => {
                m.add_answer(a(pod, *ip));
            }
            None => m.metadata.response_code = ResponseCode::NXDomain,
        },
        // No AAAA records: an empty answer.
        RecordType::AAAA if pods.iter().any(|(pod, ..)| *pod == name) => {}
        _ => m.metadata.response_code = ResponseCode::NXDomain,
    }
    m
}

async fn serve(socket: UdpSocket, zone: Zone) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            return;
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if let Ok(bytes) = answer(&query, &zone).to_vec() {
            let _ = socket.send_to(&bytes, from).await;
        }
    }
}

async fn next(rx: &mut watch::Receiver<EndpointSet>) -> EndpointSet {
    tokio::time::timeout(Duration::from_secs(10), rx.changed())
        .await
        .expect("a set within 10 s")
        .expect("source running");
    rx.borrow_and_update().clone()
}

fn names(set: &EndpointSet) -> Vec<&str> {
    set.endpoints.iter().map(|e| e.name.as_str()).collect()
}

#[tokio::test]
async fn srv_records_through_a_real_dns_client() {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let server: SocketAddr = socket.local_addr().unwrap();
    let zone: Zone = Arc::new(Mutex::new(Some(vec![
        (
            "pod-a.vllm.inference.svc.test.",
            Ipv4Addr::new(10, 1, 0, 1),
            8000,
            true,
        ),
        (
            "pod-b.vllm.inference.svc.test.",
            Ipv4Addr::new(10, 1, 0, 2),
            8001,
            false,
        ),
    ])));
    let dns = tokio::spawn(serve(socket, zone.clone()));

    let cfg = DiscoveryConfig {
        source: SourceKind::Dns,
        record: DnsRecord::Srv,
        name: Some(SERVICE.into()),
        interval_ms: 100,
        lookup_timeout_ms: 2_000,
        kv_events_port: Some(5557),
        ..DiscoveryConfig::default()
    };
    cfg.validate().unwrap();
    let source = DnsSource::new(&cfg, SystemResolver::with_name_servers(vec![server])).unwrap();
    let (tx, mut rx) = watch::channel(EndpointSet::default());
    let task = tokio::spawn(source.run(tx, std::future::pending()));

    let first = next(&mut rx).await;
    assert_eq!(first.error, None);
    assert_eq!(names(&first), ["10.1.0.1:8000", "10.1.0.2:8001"]);
    assert_eq!(first.endpoints[1].url, "http://10.1.0.2:8001");
    assert_eq!(
        first.endpoints[0].kv_events.as_deref(),
        Some("tcp://10.1.0.1:5557")
    );

    // A rolling update: pod-b replaced by pod-c on another address.
    *zone.lock().unwrap() = Some(vec![
        (
            "pod-a.vllm.inference.svc.test.",
            Ipv4Addr::new(10, 1, 0, 1),
            8000,
            true,
        ),
        (
            "pod-c.vllm.inference.svc.test.",
            Ipv4Addr::new(10, 1, 0, 3),
            8001,
            true,
        ),
    ]);
    let rolled = next(&mut rx).await;
    assert_eq!(names(&rolled), ["10.1.0.1:8000", "10.1.0.3:8001"]);

    // The server fails: the last set is kept, with the error.
    *zone.lock().unwrap() = None;
    let failed = next(&mut rx).await;
    assert_eq!(names(&failed), names(&rolled));
    assert!(
        failed.error.as_deref().unwrap().contains("resolving SRV"),
        "{:?}",
        failed.error
    );

    task.abort();
    dns.abort();
}
