//! An OSS node taking images of a domain from its peers, through its seam: parts from two
//! members interleaved each make a whole image, a part from a stranger or an image naming a
//! key outside its domain is not taken, and nothing of it is installed before it is durable.

use std::sync::Arc;

use atomos_core::{Engine, EngineConfig, Key};
use atomos_protocols::oss::{DomainImage, OssConfig, OssMsg, OssNode, OssOutput, OssRecord, TxId};
use atomos_seam::{Input, Machine, Output, Write};

fn node() -> OssNode {
    let mut cfg = OssConfig::new(1, vec![1, 2, 3]);
    cfg.domains = vec![String::new(), "acct/".into()];
    let engine = Arc::new(Engine::new(EngineConfig {
        replicated: true,
        ..EngineConfig::default()
    }));
    OssNode::open(cfg, engine, &[]).expect("opens")
}

/// An image of domain 1 through `through` with `objects` keys of about 200 KiB each.
fn image(through: u64, objects: usize, key: impl Fn(usize) -> String) -> DomainImage {
    DomainImage {
        domain: 1,
        through,
        digest: 7,
        recent: vec![(
            TxId {
                node: 2,
                run: 1,
                n: 1,
            },
            through,
        )],
        objects: (0..objects)
            .map(|i| (Key::from(key(i)), i as u64 + 1, Some(vec![1; 200 << 10])))
            .collect(),
    }
}

fn deliver(n: &mut OssNode, from: u64, msg: OssMsg) -> Vec<OssOutput> {
    let mut out = Vec::new();
    n.step(0, Input::Message { from, msg }, &mut out)
        .expect("steps");
    out
}

/// The image records among `out`'s disk writes.
fn images_persisted(out: &[OssOutput]) -> Vec<DomainImage> {
    out.iter()
        .filter_map(|o| match o {
            Output::Persist(Write::Append(records)) => Some(records),
            _ => None,
        })
        .flatten()
        .filter_map(|r| match OssRecord::decode(r) {
            Ok(OssRecord::Image(i)) => Some(i),
            _ => None,
        })
        .collect()
}

#[test]
fn parts_from_two_members_interleaved_each_make_a_whole_image() {
    let mut n = node();
    let from_2 = image(40, 12, |i| format!("acct/{i:03}")).into_parts();
    let from_3 = image(45, 12, |i| format!("acct/{i:03}")).into_parts();
    assert!(from_2.len() > 1 && from_3.len() > 1);
    let mut persisted = Vec::new();
    for (a, b) in from_2.iter().zip(&from_3) {
        persisted.extend(images_persisted(&deliver(
            &mut n,
            2,
            OssMsg::ImagePart(a.clone()),
        )));
        persisted.extend(images_persisted(&deliver(
            &mut n,
            3,
            OssMsg::ImagePart(b.clone()),
        )));
    }
    // Node 2's completed first and was persisted whole; node 3's, further, too.
    let throughs: Vec<u64> = persisted.iter().map(|i| i.through).collect();
    assert_eq!(throughs, vec![40, 45]);
    assert!(persisted.iter().all(|i| i.objects.len() == 12));
    // Not installed before it is durable.
    assert_eq!(n.watermarks(1).map(|w| w.3), Some(0));
    let mut out = Vec::new();
    n.step(0, Input::Persisted { through: 100 }, &mut out)
        .expect("steps");
    assert_eq!(n.applied_digest(1), Some((45, 7)));
    assert_eq!(n.counters().images_installed, 1);
}

#[test]
fn an_image_from_a_stranger_or_naming_keys_outside_its_domain_is_not_taken() {
    let mut n = node();
    for part in image(40, 1, |i| format!("acct/{i}")).into_parts() {
        assert!(images_persisted(&deliver(&mut n, 9, OssMsg::ImagePart(part))).is_empty());
    }
    for key in [|i| format!("list/{i}"), |i| format!("local/{i}")] {
        for part in image(40, 1, key).into_parts() {
            let out = deliver(&mut n, 2, OssMsg::ImagePart(part));
            assert!(images_persisted(&out).is_empty());
            assert!(out.iter().any(|o| matches!(o, Output::Warn(_))), "{out:?}");
        }
    }
    let mut impossible = image(u64::MAX, 1, |i| format!("acct/{i}")).into_parts();
    let out = deliver(&mut n, 2, OssMsg::ImagePart(impossible.remove(0)));
    assert!(images_persisted(&out).is_empty());
    assert_eq!(n.counters().images_installed, 0);
}
