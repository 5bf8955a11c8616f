use super::poison_message;

#[test]
fn the_poison_message_names_the_delivery_the_cap_and_every_cause() {
    let m = poison_message(40, 3);
    for part in [
        "delivery 40 ",
        "max_attempts(3)",
        "a worker died",
        "cap was lowered",
        "stored attempt count was edited",
        "Replay",
    ] {
        assert!(m.contains(part), "{part:?} missing from {m:?}");
    }
    assert!(!m.contains("a worker died while running it"), "{m}");
}
