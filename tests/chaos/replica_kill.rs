//! A gateway replica killed outright (SIGKILL, no leave message): replica A is the real binary
//! as a child process, replica B runs in this process, both gossiping over three engines.

use crate::child::Child;
use crate::common::*;
use crate::harness;
use std::time::Instant;

/// B's gossip peer A is a child process seeded with B's address. Both serve until B sees A live
/// and has learned from it; then A is killed with SIGKILL, so it never says goodbye. Asserts: B
/// marks A down by failure detection alone within 5 s (suspect-to-down 600 ms plus probe
/// rounds); B keeps routing through and after the detection, with its gossip peer gone (40
/// requests, 0 lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_killed_without_leaving_is_detected_and_nothing_is_lost() {
    let t = Instant::now();
    let fleet = harness::fleet(3, false).await;
    let infos = fleet.instances();
    let model = infos[0].model.clone();
    let b = Gateway::start(crate::replicas::with_gossip(&infos, vec![])).await;
    let gb = crate::replicas::gossip_of(&b).await;
    harness::all_usable(&b).await;

    let mut cfg_a = crate::replicas::with_gossip(&infos, vec![gb.local_addr().to_string()]);
    cfg_a.server.listen = "127.0.0.1:0".into();
    // The secret is never serialized (a config dump must not leak it); the file gets it back.
    let mut file = toml::Value::try_from(&cfg_a).expect("config as TOML");
    file["gossip"]
        .as_table_mut()
        .expect("[gossip]")
        .insert("secret".into(), cfg_a.gossip.secret.clone().into());
    let a = Child::start(&toml::to_string(&file).expect("TOML text"));
    assert!(
        eventually(10, || gb.live_peers() == 1).await,
        "A never joined B"
    );
    // Both replicas serve: A's placements reach B by gossip.
    let url_a = format!("http://{}/v1/chat/completions", a.addr);
    for i in 0..10 {
        let r = client()
            .post(&url_a)
            .json(&harness::chat(&model, 7_000 + i, 4, false))
            .send()
            .await
            .expect("A answers");
        assert_eq!(r.status(), 200);
    }
    crate::replicas::serve(&b, &model, 10).await;

    let killed = Instant::now();
    drop(a); // SIGKILL and reap.
             // B goes on routing while its failure detector works.
    let served = tokio::spawn({
        let url = b.url("/v1/chat/completions");
        let model = model.clone();
        async move {
            let mut lost = 0;
            for i in 0..40 {
                let ok = client()
                    .post(&url)
                    .json(&harness::chat(&model, 8_000 + i, 4, false))
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200);
                lost += usize::from(!ok);
            }
            lost
        }
    });
    let detected = eventually(5, || gb.live_peers() == 0).await;
    assert!(detected, "B still counts A live 5 s after the kill");
    let after_ms = killed.elapsed().as_secs_f64() * 1e3;
    eprintln!("  B marked the killed replica down after {after_ms:.0} ms");
    assert_eq!(served.await.expect("load task"), 0, "requests lost on B");
    eprintln!(
        "chaos replica kill: 40 requests on B, 0 lost, {:.2} s",
        t.elapsed().as_secs_f64()
    );
    drop(b);
    fleet.shutdown().await;
}
