//! The subscriber-set scenarios: counts, pages and the per-user index of the sets
//! reminders keep, across restarts.

use std::collections::BTreeSet;

use belfry_core::{UserId, UserPage};

use super::Harness;

fn users(ids: &[&str]) -> Vec<UserId> {
    ids.iter().map(|id| UserId::new(id).unwrap()).collect()
}

/// Every member of `set`, read in pages of `page`. Each page is read both as ids and into
/// one buffer ([`crate::Store::subscriber_page`]), and the two must agree.
fn all_members(h: &dyn Harness, set: u64, page: usize) -> Vec<UserId> {
    let mut out: Vec<UserId> = Vec::new();
    let mut buffer = UserPage::default();
    // What a reused buffer held before must not leak into the next page.
    buffer.push(&UserId::new("stale").unwrap());
    loop {
        let got = h.store().subscribers(set, out.last(), page).unwrap();
        assert!(got.len() <= page);
        h.store()
            .subscriber_page(set, out.last(), page, &mut buffer)
            .unwrap();
        assert_eq!(
            buffer.iter().collect::<Vec<_>>(),
            got.iter().map(UserId::as_str).collect::<Vec<_>>()
        );
        let done = got.len() < page;
        out.extend(got);
        if done {
            return out;
        }
    }
}

pub fn subscriptions_basics(h: &mut dyn Harness) {
    let s = h.store();
    assert_eq!(
        s.subscribe(7, &users(&["3", "1", "alice", "2", "1"]))
            .unwrap(),
        4
    );
    assert_eq!(s.subscribe(7, &users(&["3", "4"])).unwrap(), 1);
    assert_eq!(s.subscribe(8, &users(&["1", "zoe"])).unwrap(), 2);
    assert_eq!(s.subscriber_count(7).unwrap(), 5);
    assert_eq!(s.subscriber_count(9).unwrap(), 0);
    assert_eq!(s.subscriber_counts(&[8, 9, 7, 8]).unwrap(), [2, 0, 5, 2]);
    assert_eq!(s.subscriber_counts(&[]).unwrap(), Vec::<u64>::new());
    assert!(s.is_subscribed(7, &users(&["alice"])[0]).unwrap());
    assert!(!s.is_subscribed(8, &users(&["alice"])[0]).unwrap());
    // Numbers first, by value; then other ids.
    assert_eq!(all_members(h, 7, 2), users(&["1", "2", "3", "4", "alice"]));
    let after = UserId::new("2").unwrap();
    assert_eq!(
        h.store().subscribers(7, Some(&after), 2).unwrap(),
        users(&["3", "4"])
    );
    assert_eq!(
        h.store().user_sets(&UserId::new("1").unwrap(), 10).unwrap(),
        vec![7, 8]
    );
    assert_eq!(
        h.store().user_sets(&UserId::new("1").unwrap(), 1).unwrap(),
        vec![7]
    );

    assert_eq!(
        h.store().unsubscribe(7, &users(&["2", "99", "2"])).unwrap(),
        1
    );
    h.reopen(false);
    assert_eq!(h.store().subscriber_count(7).unwrap(), 4);
    assert_eq!(all_members(h, 7, 3), users(&["1", "3", "4", "alice"]));
    assert!(h
        .store()
        .user_sets(&UserId::new("2").unwrap(), 10)
        .unwrap()
        .is_empty());
    h.crash();
    assert_eq!(h.store().subscriber_count(8).unwrap(), 2);
    assert_eq!(
        h.store()
            .user_sets(&UserId::new("zoe").unwrap(), 10)
            .unwrap(),
        vec![8]
    );

    assert_eq!(h.store().drop_set(7).unwrap(), 4);
    assert_eq!(h.store().subscriber_count(7).unwrap(), 0);
    assert!(all_members(h, 7, 10).is_empty());
    assert_eq!(
        h.store().user_sets(&UserId::new("1").unwrap(), 10).unwrap(),
        vec![8]
    );
    h.crash();
    assert_eq!(h.store().subscriber_count(7).unwrap(), 0);
    assert_eq!(h.store().subscribe(7, &users(&["1"])).unwrap(), 1);
    assert_eq!(
        h.store().user_sets(&UserId::new("1").unwrap(), 10).unwrap(),
        vec![7, 8]
    );
    assert_eq!(h.store().subscriber_count(8).unwrap(), 2);
}

/// Thousands of members over two sets, with unsubscribes, across clean and unclean restarts:
/// counts, pages and the per-user index agree with a plain set.
pub fn subscriptions_many(h: &mut dyn Harness) {
    let mut expect: [BTreeSet<UserId>; 2] = Default::default();
    let id = |i: u64| {
        let text = if i.is_multiple_of(5) {
            format!("u-{i}")
        } else {
            i.to_string()
        };
        UserId::new(text).unwrap()
    };
    for round in 0..20u64 {
        for (set, want) in expect.iter_mut().enumerate() {
            let batch: Vec<UserId> = (0..1_000)
                .map(|i| id((i * 7 + round * 13) % 12_000))
                .collect();
            let fresh = batch.iter().filter(|u| want.insert((*u).clone())).count() as u64;
            assert_eq!(h.store().subscribe(set as u64, &batch).unwrap(), fresh);
        }
        if round % 3 == 2 {
            let gone: Vec<UserId> = (0..400).map(|i| id(i * 29 % 12_000)).collect();
            for (set, want) in expect.iter_mut().enumerate() {
                let removed = gone.iter().filter(|u| want.remove(*u)).count() as u64;
                assert_eq!(h.store().unsubscribe(set as u64, &gone).unwrap(), removed);
            }
        }
        match round {
            7 => h.reopen(true),
            13 => h.crash(),
            _ => {}
        }
    }
    for (set, want) in expect.iter().enumerate() {
        assert_eq!(
            h.store().subscriber_count(set as u64).unwrap(),
            want.len() as u64
        );
        let got = all_members(h, set as u64, 777);
        assert_eq!(got, want.iter().cloned().collect::<Vec<_>>());
    }
    for i in [0, 1, 5, 29, 11_999] {
        let user = id(i);
        let want: Vec<u64> = (0..2)
            .filter(|&s| expect[s as usize].contains(&user))
            .collect();
        assert_eq!(h.store().user_sets(&user, 10).unwrap(), want, "{user}");
    }
}
