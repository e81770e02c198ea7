//! partitions.conf: each grammar element, each refusal with its position,
//! the UFM manual's examples, a 32,768-partition plan, and properties: no input
//! panics, generated plans derive as a simple model says, and whatever is
//! accepted derives the same again from its canonical print.

use std::{fmt::Write as _, path::Path};

use proptest::{collection::vec, prelude::*, sample::select};

use super::{Derived, DerivedGroup, Options, PartitionsError, derive};

const PORT: u64 = 0x123456;
const FILE: &str = "p.conf";

fn run(text: &str, port_guid: u64, is_sm: bool) -> Result<Derived, PartitionsError> {
    derive(Path::new(FILE), text, &Options { port_guid, is_sm })
}

#[track_caller]
fn ok_for(text: &str, port_guid: u64, is_sm: bool) -> Derived {
    run(text, port_guid, is_sm).unwrap_or_else(|e| panic!("{e}"))
}

#[track_caller]
fn ok(text: &str) -> Derived {
    ok_for(text, PORT, false)
}

#[track_caller]
fn pkeys(text: &str) -> Vec<u16> {
    ok(text).pkeys
}

/// Asserts that `text` is refused at `line:column` saying `says`.
#[track_caller]
fn refused(text: &str, line: usize, column: usize, says: &str) {
    let e = run(text, PORT, false).expect_err("must be refused");
    assert_eq!((e.line, e.column), (line, column), "{e}");
    assert!(e.message.contains(says), "{e}");
}

/// Asserts a warning at `line:column` saying `says`.
#[track_caller]
fn warned(d: &Derived, line: usize, column: usize, says: &str) {
    let at = format!("{FILE}:{line}:{column}: ");
    assert!(
        d.warnings
            .iter()
            .any(|w| w.starts_with(&at) && w.contains(says)),
        "no warning {at}…{says}… in {:#?}",
        d.warnings
    );
}

fn group(mgid: &str, pkey: u16, qkey: u32) -> DerivedGroup {
    DerivedGroup {
        mgid: mgid.parse().unwrap(),
        pkey,
        qkey,
    }
}

fn fixture(name: &str) -> String {
    let path = pkeyfw_testkit::fixtures::partitions(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// The default partition.

#[test]
fn with_no_rules_the_port_is_a_limited_default_member() {
    for text in ["", "# only a comment\n\n \t\n"] {
        let d = ok(text);
        assert_eq!(d.pkeys, [0x7fff]);
        assert_eq!(d.names, ["Default"]);
        assert!(d.groups.is_empty() && d.warnings.is_empty());
    }
}

#[test]
fn the_sm_is_a_full_default_member() {
    assert_eq!(ok_for("", PORT, true).pkeys, [0xffff]);
}

#[test]
fn rules_for_the_default_partition_merge_into_the_implicit_one() {
    assert_eq!(pkeys("Default=0x7fff : ALL=full ;"), [0xffff]);
    assert_eq!(pkeys("Default=0x7fff : SELF=full ;"), [0x7fff]);
    assert_eq!(ok("Other=0x7fff : ALL ;").names, ["Default"]);
}

#[test]
fn a_default_rule_leaving_this_port_out_cannot_and_says_so() {
    let text = "Default=0x7fff : ALL_SWITCHES=full, SELF=full ;";
    let d = ok(text);
    assert_eq!(d.pkeys, [0x7fff]);
    warned(&d, 1, 1, "yet OpenSM keeps it a member");
    assert!(ok_for(text, PORT, true).warnings.is_empty());
}

// Partition definitions.

#[test]
fn a_member_is_limited_unless_said_otherwise() {
    assert_eq!(pkeys("P=0x10 : 0x123456 ;"), [0x7fff, 0x0010]);
    assert_eq!(pkeys("P=0x10 : 0x123456=limited ;"), [0x7fff, 0x0010]);
    assert_eq!(pkeys("P=0x10 : 0x123456=full ;"), [0x7fff, 0x8010]);
    assert_eq!(
        pkeys("P=0x10, defmember=full : 0x123456 ;"),
        [0x7fff, 0x8010]
    );
    assert_eq!(
        pkeys("P=0x10, defmember=full : 0x123456=limited ;"),
        [0x7fff, 0x0010]
    );
    assert_eq!(
        pkeys("P=0x10, defmember=limited : 0x123456 ;"),
        [0x7fff, 0x0010]
    );
}

#[test]
fn both_gives_a_full_and_a_limited_entry_with_a_warning() {
    let d = ok("P=0x10 : 0x123456=both ;");
    assert_eq!(d.pkeys, [0x7fff, 0x8010, 0x0010]);
    assert_eq!(d.names, ["Default", "P", "P"]);
    warned(&d, 1, 10, "allow_both_pkeys");
    assert_eq!(
        pkeys("P=0x10, defmember=both : ALL ;"),
        [0x7fff, 0x8010, 0x0010]
    );
}

#[test]
fn naming_the_port_again_full_wins_and_both_wins() {
    assert_eq!(
        pkeys("P=0x10 : 0x123456, 0x123456=full, ALL ;"),
        [0x7fff, 0x8010]
    );
    assert_eq!(
        pkeys("P=0x10 : ALL=full ;\nP=0x10 : 0x123456 ;"),
        [0x7fff, 0x8010]
    );
    assert_eq!(
        pkeys("P=0x10 : ALL=both ;\nP=0x10 : 0x123456=full ;"),
        [0x7fff, 0x8010, 0x0010]
    );
    assert_eq!(
        pkeys("P=0x10 : ALL ;\nP=0x10 : ALL_CAS=both ;"),
        [0x7fff, 0x8010, 0x0010]
    );
}

#[test]
fn only_the_low_15_bits_of_a_p_key_count() {
    assert_eq!(pkeys("P=0x8010 : ALL ;"), [0x7fff, 0x0010]);
    assert_eq!(pkeys("P=0xffff : ALL=full ;"), [0xffff]);
    assert_eq!(pkeys("P=16 : ALL ;"), [0x7fff, 0x0010]);
}

#[test]
fn a_repeated_p_key_merges_into_the_first_definition() {
    let d = ok("First=0x10 : NONE ;\nOther=0x20 : ALL ;\nSecond=0x10 : ALL=full ;");
    assert_eq!(d.pkeys, [0x7fff, 0x8010, 0x0020]);
    assert_eq!(d.names, ["Default", "First", "Other"]);
}

#[test]
fn entries_follow_first_appearance() {
    let d = ok("C=0x30 : NONE ;\nA=0x10 : ALL ;\nB=0x20 : ALL ;\nC=0x30 : ALL ;");
    assert_eq!(d.pkeys, [0x7fff, 0x0030, 0x0010, 0x0020]);
}

#[test]
fn names_are_optional_and_a_leading_digit_makes_a_p_key() {
    let d = ok("=0x10 : ALL ;\n0x20 : ALL ;\n, ipoib : ALL ;\n: ALL ;");
    assert_eq!(d.pkeys, [0x7fff, 0x0010, 0x0020, 0x0001, 0x0002]);
    assert_eq!(d.names, ["Default", "", "", "", ""]);
    assert_eq!(ok("Ωmega-1.b=0x10 : ALL ;").names[1], "Ωmega-1.b");
}

#[test]
fn missing_p_keys_are_generated_upwards_from_1_skipping_used_ones() {
    let d = ok("A=0x1 : ALL ; B : ALL ; C=0x3 : ALL ; D : ALL ; E : ALL ;");
    assert_eq!(d.pkeys, [0x7fff, 1, 2, 3, 4, 5]);
    assert_eq!(d.names, ["Default", "A", "B", "C", "D", "E"]);
}

#[test]
fn a_definition_without_p_key_joins_the_partition_of_its_name() {
    let d = ok("A : 0x1 ;\nA : ALL ;");
    assert_eq!(d.pkeys, [0x7fff, 0x0001]);
    warned(&d, 2, 1, "adds it to the earlier `A` (0x0001) by name");
    assert_eq!(pkeys("X=0x10 : NONE ;\nX : ALL ;"), [0x7fff, 0x0010]);
    assert_eq!(pkeys("Default : ALL=full ;"), [0xffff]);
}

#[test]
fn a_definition_spans_lines_and_several_share_a_line() {
    let text = "P = 0x10 , ipoib :\n  0x1,\n  0x123456 = full # me\n  0x2\n\n ; Q=0x20:ALL;R\t=\t0x30\t:\tALL=full;";
    assert_eq!(pkeys(text), [0x7fff, 0x8010, 0x0020, 0x8030]);
    assert_eq!(pkeys("P=0x10 :\n 0x1,\n 0x123456,\n;"), [0x7fff, 0x0010]);
    assert_eq!(pkeys("P=0x10 : ;"), [0x7fff]);
}

// Members.

#[test]
fn keywords_name_this_ca_port_as_opensm_would() {
    let member = |m: &str, is_sm: bool| ok_for(&format!("P=0x10 : {m} ;"), PORT, is_sm).pkeys;
    for m in [
        "ALL",
        "ALL_CAS",
        "0x123456",
        "0X123456",
        "1193046",
        "0x0000000000123456",
    ] {
        assert_eq!(member(m, false), [0x7fff, 0x0010], "{m}");
    }
    for m in ["ALL_SWITCHES", "ALL_ROUTERS", "NONE", "SELF", "0x123457"] {
        assert_eq!(member(m, false), [0x7fff], "{m}");
    }
    assert_eq!(member("SELF", true), [0xffff, 0x0010]);
    assert_eq!(member("0xffffffffffffffff", false), [0x7fff]);
}

#[test]
fn indx0_puts_its_partition_first() {
    let d = ok("A=0x10 : ALL ;\nB=0x20, indx0 : ALL=both ;\nC=0x30 : ALL ;");
    assert_eq!(d.pkeys, [0x8020, 0x0020, 0x7fff, 0x0010, 0x0030]);
    assert_eq!(d.names, ["B", "B", "Default", "A", "C"]);
    assert_eq!(
        pkeys("B=0x20, indx0 : 0x1 ;\nA=0x10 : ALL ;"),
        [0x7fff, 0x0010]
    );
    assert_eq!(
        pkeys("B=0x20, indx0 : ALL ;\nB=0x20, indx0 : ALL=full ;"),
        [0x8020, 0x7fff]
    );
    assert_eq!(
        pkeys("B=0x20 : ALL ;\nB=0x20, indx0 : 0x123456 ;"),
        [0x0020, 0x7fff]
    );
}

#[test]
fn indx0_twice_for_this_port_is_refused() {
    refused(
        "A=0x10, indx0 : ALL ;\nB=0x20, indx0 : ALL ;",
        2,
        9,
        "indx0 for this port again",
    );
    // Not this port's business.
    assert_eq!(
        pkeys("A=0x10, indx0 : ALL ;\nB=0x20, indx0 : 0x1 ;"),
        [0x0010, 0x7fff]
    );
}

#[test]
fn naming_the_port_again_without_indx0_is_refused() {
    refused(
        "A=0x10, indx0 : ALL ;\nA=0x10 : 0x123456 ;",
        2,
        1,
        "forgets the indx0 of line 1",
    );
}

// Abbreviations and the UFM manual's spellings.

#[test]
fn abbreviations_are_taken_as_opensm_takes_them_with_a_warning() {
    let d = ok("P=0x10, defmem=f, ip :\n ALL_C=lim, S ;");
    assert_eq!(d.pkeys, [0x7fff, 0x0010]);
    assert_eq!(
        d.groups,
        [group("ff12:401b:8010::ffff:ffff", 0x0010, 0x0b1b)]
    );
    warned(&d, 1, 9, "`defmem` taken as `defmember`");
    warned(&d, 1, 16, "`f` taken as `full`");
    warned(&d, 1, 19, "`ip` taken as `ipoib`");
    warned(&d, 2, 2, "`ALL_C` taken as `ALL_CAS`");
    warned(&d, 2, 8, "`lim` taken as `limited`");
    warned(&d, 2, 13, "`S` taken as `SELF`");
    assert_eq!(d.warnings.len(), 6);
    // The first match in OpenSM's order wins.
    warned(&ok("P=0x10 : A, ALL_ ;"), 1, 10, "`A` taken as `ALL`");
    warned(
        &ok("P=0x10 : A, ALL_ ;"),
        1,
        13,
        "`ALL_` taken as `ALL_CAS`",
    );
    warned(&ok("P=0x10 : NO, 0x1=b ;"), 1, 10, "`NO` taken as `NONE`");
    let d = ok("P=0x10 :\n mgid=ff12::1,Q=0x5,s=3,sl=1,F=2,T=3,m=4,r=3\n ALL ;");
    assert_eq!(d.groups, [group("ff13::1", 0x0010, 5)]);
    warned(&d, 2, 15, "`Q` taken as `Q_Key`");
    warned(&d, 2, 21, "`s` taken as `scope`");
}

#[test]
fn the_ufm_manuals_lowercase_qkey_and_tclass_are_taken_with_a_warning() {
    let d = ok("P=0x10, ipoib, qkey=0x42, tclass=1 : ALL ;");
    assert_eq!(d.groups, [group("ff12:401b:8010::ffff:ffff", 0x0010, 0x42)]);
    warned(
        &d,
        1,
        16,
        "upstream OpenSM knows only `Q_Key` and ignores `qkey`",
    );
    warned(&d, 1, 27, "`tclass` taken as `TClass`");
}

#[test]
fn the_ufm_manuals_flags_between_two_colons_are_taken_with_a_warning() {
    let d = ok("ShareIO = 0x80 : defmember=full, ipoib : 0x123456 ;");
    assert_eq!(d.pkeys, [0x7fff, 0x8080]);
    assert_eq!(
        d.groups,
        [group("ff12:401b:8080::ffff:ffff", 0x8080, 0x0b1b)]
    );
    warned(&d, 1, 18, "UFM manual's form");
    refused("S=0x80 : defmember=full 0x1 ;", 1, 25, "the second `:`");
}

// Multicast groups.

#[test]
fn ip_groups_get_the_partition_p_key_and_the_ipoib_q_key() {
    let d = ok("P=0x10 :\n mgid=ff12:401b::1\n mgid=ff12:601b:8010::2, Q_Key=7\n ALL ;");
    assert_eq!(
        d.groups,
        [
            group("ff12:401b:8010::1", 0x0010, 0x0b1b),
            group("ff12:601b:8010::2", 0x0010, 7)
        ]
    );
    // The broadcast GID is always acceptable, whatever its P_Key bits say.
    let d = ok("P=0x10 :\n mgid=ff12:401b:ffff::ffff:ffff\n ALL ;");
    assert_eq!(
        d.groups,
        [group("ff12:401b:8010::ffff:ffff", 0x0010, 0x0b1b)]
    );
}

#[test]
fn other_groups_keep_their_gid_and_q_key_0_by_default() {
    let d = ok("P=0x10 :\n mgid=ff12::1\n mgid=ff12::2,Q_Key=0x5\n ALL=full ;");
    assert_eq!(
        d.groups,
        [group("ff12::1", 0x8010, 0), group("ff12::2", 0x8010, 5)]
    );
}

#[test]
fn opensm_sets_the_scope_once_per_scope_asked_for() {
    let d = ok("P=0x10 :\n mgid=ff15::1,scope=5,scope=8\n mgid=ff15::2\n ALL ;");
    let expected = [
        group("ff15::1", 0x10, 0),
        group("ff18::1", 0x10, 0),
        group("ff12::2", 0x10, 0),
    ];
    assert_eq!(d.groups, expected);
    warned(
        &d,
        3,
        7,
        "OpenSM gives ff15::2 scope 2 (link-local), not 5: add scope=5",
    );
    assert_eq!(d.warnings.len(), 1);
}

#[test]
fn groups_inherit_the_partitions_q_key_scope_rate_and_mtu() {
    let text = "P=0x10, Q_Key=0x7, scope=5, rate=6, mtu=5 :\n mgid=ff15::1\n mgid=ff15:401b::1,rate=6,mtu=5\n ALL ;";
    let d = ok(text);
    assert_eq!(
        d.groups,
        [
            group("ff15::1", 0x10, 7),
            group("ff15:401b:8010::1", 0x10, 7)
        ]
    );
}

#[test]
fn ipoib_creates_the_broadcast_group() {
    let d = ok("P=0x10, ipoib : ALL ;");
    assert_eq!(
        d.groups,
        [group("ff12:401b:8010::ffff:ffff", 0x0010, 0x0b1b)]
    );
    let d = ok("P=0x10, ipoib, scope=5, Q_Key=0x1234 : ALL=full ;");
    assert_eq!(
        d.groups,
        [group("ff15:401b:8010::ffff:ffff", 0x8010, 0x1234)]
    );
}

#[test]
fn only_groups_of_this_ports_partitions_count_with_its_full_entry() {
    let d = ok("P=0x10, ipoib : 0x1 ;\nQ=0x20, ipoib : ALL=both ;");
    assert_eq!(
        d.groups,
        [group("ff12:401b:8020::ffff:ffff", 0x8020, 0x0b1b)]
    );
}

#[test]
fn a_repeated_group_is_one_group() {
    let d = ok("P=0x10, ipoib : ALL ;\nP=0x10, ipoib : mgid=ff12::1\n mgid=ff12::1\n ;");
    let expected = [
        group("ff12:401b:8010::ffff:ffff", 0x10, 0x0b1b),
        group("ff12::1", 0x10, 0),
    ];
    assert_eq!(d.groups, expected);
}

// Refusals.

#[test]
fn a_missing_semicolon_is_refused() {
    refused(
        "P=0x10 : ALL",
        1,
        13,
        "expected `;` to end the definition of partition `P` (0x0010) begun on line 1",
    );
    refused("P=0x10 : ALL\n", 2, 1, "found the end of the file");
    let e = run("P=0x10 : ALL", PORT, false).unwrap_err();
    assert!(
        e.to_string().starts_with("p.conf:1:13: expected `;`"),
        "{e}"
    );
}

#[test]
fn a_definition_header_must_end_with_colon_on_its_line() {
    refused("P=0x10,\n ipoib : ALL ;", 1, 8, "expected a partition flag");
    refused(
        "P=0x10\n : ALL ;",
        1,
        7,
        "or `:`, on the line the partition definition starts",
    );
    refused("P=0x10 # c\n : ALL ;", 1, 8, "found a comment");
    refused(";", 1, 1, "found `;`");
    refused("Foo Bar=0x10 : ALL ;", 1, 5, "found `Bar`");
    refused("0x10=0x20 : ALL ;", 1, 5, "found `=`");
}

#[test]
fn unknown_flags_and_words_are_refused() {
    refused("P=0x10, fast : ALL ;", 1, 9, "unknown flag `fast`");
    refused("P=0x10, indx : ALL ;", 1, 9, "unknown flag `indx`");
    refused("P=0x10, Ipoib : ALL ;", 1, 9, "unknown flag `Ipoib`");
    refused("P=0x10, : ALL ;", 1, 9, "expected a partition flag");
    refused("P=0x10 : ALL=half ;", 1, 14, "unknown membership `half`");
    refused(
        "P=0x10, defmember=none : ALL ;",
        1,
        19,
        "unknown membership `none`",
    );
    refused("P=0x10 : all ;", 1, 10, "unknown member `all`");
    refused("P=0x10 : ALL_FOO ;", 1, 10, "unknown member `ALL_FOO`");
    refused("P=0x10 : NONE=full ;", 1, 15, "`NONE` takes no membership");
    refused(
        "P=0x10 :\n mgid=ff12::1,ipoib\n ;",
        2,
        15,
        "unknown flag `ipoib`",
    );
}

#[test]
fn bad_numbers_are_refused() {
    refused("P=0x10g : ALL ;", 1, 3, "found `0x10g`");
    refused("P=12ab : ALL ;", 1, 3, "found `12ab`");
    refused("P=0x : ALL ;", 1, 3, "found `0x`");
    refused("P= : ALL ;", 1, 4, "expected a P_Key after `=`, found `:`");
    refused("P=010 : ALL ;", 1, 3, "reads as octal");
    refused("P=0x10 : 0123 ;", 1, 10, "reads as octal");
    refused("P=0x10, mtu=x : ;", 1, 13, "expected an MTU code");
}

#[test]
fn p_keys_out_of_range_are_refused() {
    refused(
        "P=0x18001 : ALL ;",
        1,
        3,
        "does not fit in 16 bits: expected at most 0xffff (OpenSM would take 0x8001)",
    );
    refused("P=0x8000 : ALL ;", 1, 3, "key portion 0");
    refused("P=0 : ALL ;", 1, 3, "key portion 0");
    refused("0 : ALL ;", 1, 1, "key portion 0");
    refused(
        "P=0x100000000000000000 : ALL ;",
        1,
        3,
        "does not fit in 64 bits",
    );
}

#[test]
fn guids_out_of_range_are_refused() {
    refused(
        "P=0x10 : 0x10000000000000000 ;",
        1,
        10,
        "does not fit in 64 bits",
    );
    refused(
        "P=0x10 : 18446744073709551616 ;",
        1,
        10,
        "does not fit in 64 bits",
    );
    refused("P=0x10 : 0 ;", 1, 10, "port GUID 0");
    refused("P=0x10 : 0x0 ;", 1, 10, "port GUID 0");
}

#[test]
fn member_separators_are_checked() {
    refused("P=0x10 : 0x1,,0x2 ;", 1, 14, "expected a member");
    refused("P=0x10 : , 0x1 ;", 1, 10, "expected a member");
    refused(
        "P=0x10 : 0x1 0x2 ;",
        1,
        14,
        "expected `,`, `;` or a new line after the member",
    );
    refused("P=0x10 : 0x1\n=full ;", 2, 1, "expected a member");
}

#[test]
fn flag_values_are_checked() {
    refused(
        "P=0x10, mtu=6 : ;",
        1,
        13,
        "expected an MTU code from 1 (256) to 5 (4096), found 6",
    );
    refused("P=0x10, rate=1 : ;", 1, 14, "expected a rate code");
    refused("P=0x10, scope=0 : ;", 1, 15, "expected a scope");
    refused("P=0x10, sl=16 : ;", 1, 12, "expected a service level");
    refused(
        "P=0x10, FlowLabel=0x100000 : ;",
        1,
        19,
        "expected a 20-bit flow label",
    );
    refused("P=0x10, TClass=256 : ;", 1, 16, "expected a traffic class");
    refused(
        "P=0x10, Q_Key=0 : ;",
        1,
        15,
        "expected a nonzero 32-bit Q_Key",
    );
    refused(
        "P=0x10, Q_Key=0x100000000 : ;",
        1,
        15,
        "expected a nonzero 32-bit Q_Key",
    );
    refused(
        "P=0x10, mtu : ;",
        1,
        13,
        "expected `=` and a value after `mtu`",
    );
    refused(
        "P=0x10, defmember : ;",
        1,
        19,
        "expected `=` and a value after `defmember`",
    );
    refused(
        "P=0x10, defmember= : ;",
        1,
        20,
        "expected a value for `defmember`",
    );
    refused("P=0x10, ipoib=1 : ;", 1, 15, "`ipoib` takes no value");
    refused("P=0x10, indx0=1 : ;", 1, 15, "`indx0` takes no value");
    refused("P=0x10, mtu=4, mtu=4 : ;", 1, 16, "`mtu` given twice");
    refused(
        "P=0x10, defmember=full, defmem=full : ;",
        1,
        25,
        "`defmember` given twice",
    );
    refused(
        "P=0x10 :\n mgid=ff12::1,sl=1,sl=2\n ;",
        2,
        20,
        "`sl` given twice",
    );
}

#[test]
fn bad_multicast_entries_are_refused() {
    refused(
        "P=0x10 :\n mgid=fe80::1\n ;",
        2,
        7,
        "GID fe80::1 is not multicast",
    );
    refused(
        "P=0x10 :\n mgid=ff12:::1\n ;",
        2,
        7,
        "expected an IPv6 multicast GID, found `ff12:::1`",
    );
    refused(
        "P=0x10 :\n mgid=\n ;",
        2,
        7,
        "expected a multicast GID, found the end of the line",
    );
    refused(
        "P=0x10 :\n mgid ff12::1\n ;",
        2,
        7,
        "expected `=` and a multicast GID",
    );
    refused(
        "P=0x10 :\n mgid=ff12::1, ALL\n ;",
        2,
        16,
        "unknown flag `ALL`",
    );
    refused(
        "P=0x10 :\n mgid=ff12::1 ALL\n ;",
        2,
        15,
        "an mgid entry takes the rest of its line",
    );
    refused(
        "P=0x10 :\n mgid=ff12::1,\n ALL ;",
        2,
        15,
        "found the end of the line",
    );
    refused(
        "P=0x10 :\n mgid=ff12::1,sl\n ;",
        2,
        17,
        "expected `=` and a value after `sl`",
    );
    refused(
        "P=0x10 :\n mgid=ff12::1,mtu=9\n ;",
        2,
        19,
        "expected an MTU code",
    );
}

#[test]
fn ip_groups_at_odds_with_their_partition_are_refused() {
    refused(
        "P=0x10 :\n mgid=ff12:401b:10::1\n ;",
        2,
        7,
        "carries P_Key 0x0010: expected 0x0000 (filled in) or 0x8010",
    );
    refused(
        "P=0x10 :\n mgid=ff12:401b::1,rate=6\n ;",
        2,
        7,
        "has rate 6: expected 3",
    );
    refused(
        "P=0x10 :\n mgid=ff12:601b::1,mtu=5\n ;",
        2,
        7,
        "has mtu 5: expected 4",
    );
}

#[test]
fn conflicting_groups_are_refused() {
    refused(
        "P=0x10 : mgid=ff12::1\n ; Q=0x20 : mgid=ff12::1\n ;",
        2,
        18,
        "already defined on line 1 for partition `P` (0x0010)",
    );
    refused(
        "P=0x10 : mgid=ff12::1\n mgid=ff12::1,Q_Key=5\n ;",
        2,
        7,
        "with Q_Key 0x0",
    );
    refused(
        "P=0x10, ipoib : ;\nP=0x10, ipoib, Q_Key=9 : ;",
        2,
        9,
        "ff12:401b:8010::ffff:ffff is already defined",
    );
}

#[test]
fn partition_names_are_checked() {
    let long = "N".repeat(32);
    refused(
        &format!("{long}=0x10 : ALL ;"),
        1,
        1,
        "partition name is 32 bytes long",
    );
    assert_eq!(
        ok(&format!("{}=0x10 : ALL ;", &long[1..])).names[1],
        &long[1..]
    );
    refused(
        "A=0x10 : ALL ;\nA=0x20 : ALL ;\nA : ALL ;",
        3,
        1,
        "several partitions have that name",
    );
}

#[test]
fn a_generated_p_key_given_again_explicitly_is_refused() {
    refused(
        "A : ALL ;\nB=0x1 : ALL ;",
        2,
        3,
        "P_Key 0x0001 was generated for partition `A` (0x0001) on line 1",
    );
}

#[test]
fn running_out_of_p_keys_to_generate_is_refused() {
    let text = ": ;\n".repeat(0x7ffe);
    assert_eq!(ok(&text).pkeys, [0x7fff]);
    refused(
        &format!("{text}: ;"),
        0x7fff,
        1,
        "no P_Key left to generate",
    );
}

#[test]
fn carriage_returns_and_long_lines_are_refused() {
    refused("P=0x10 : ALL ;\r\n", 1, 15, "a carriage return");
    refused("P=0x10 : ALL\r\n;", 1, 13, "a carriage return");
    assert_eq!(
        pkeys("# a comment may hold \r\nP=0x10 : ALL ;"),
        [0x7fff, 0x0010]
    );
    let line = format!("# {}", "x".repeat(4092));
    assert_eq!(pkeys(&line), [0x7fff]);
    refused(
        &format!("P=0x10 : ALL ;\n{line}x"),
        2,
        4095,
        "line is 4095 bytes long: expected at most 4094",
    );
}

#[test]
fn control_characters_are_refused() {
    refused("P=0x10 : ALL\u{0} ;", 1, 13, "control character '\\0'");
    refused("P=0x10 : ALL\u{b} ;", 1, 13, "control character");
}

// The UFM manual's examples.

#[test]
fn the_ufm_manuals_examples_give_each_port_its_table() {
    let text = fixture("ufm_manual_examples.conf");
    let table = |guid: u64, is_sm: bool| ok_for(&text, guid, is_sm).pkeys;
    assert_eq!(table(0x123456, false), [0xffff, 0x8001, 0x0300, 0x0080]);
    assert_eq!(table(0x3456789034, false), [0xffff, 0x0001, 0x0300]);
    assert_eq!(table(0x2134af2306, false), [0xffff, 0x0001, 0x0300]);
    assert_eq!(table(0x123451, false), [0xffff, 0x0300, 0x8080]);
    assert_eq!(table(0x123453, false), [0xffff, 0x0300, 0x0080]);
    assert_eq!(table(0x123455, false), [0xffff, 0x0300, 0x8080]);
    assert_eq!(table(0x123458, false), [0xffff, 0x0300, 0x8080]);
    assert_eq!(table(0x12345c, false), [0xffff, 0x0300, 0x0080]);
    assert_eq!(table(0x12345d, false), [0xffff, 0x0300, 0x8080]);
    // In no partition of its own; then the SM.
    assert_eq!(table(0x999, false), [0xffff, 0x0300]);
    assert_eq!(table(0x1, true), [0xffff, 0x8300]);
}

#[test]
fn the_ufm_manuals_examples_give_names_groups_and_warnings() {
    let d = ok(&fixture("ufm_manual_examples.conf"));
    assert_eq!(
        d.names,
        ["Default", "NewPartition", "YetAnotherOne", "ShareIO"]
    );
    let expected = [
        group("ff12:401b:ffff::ffff:ffff", 0xffff, 0x0b1b),
        group("ff12:401b:ffff::707", 0xffff, 0x0b1b),
        group("ff12:601b:ffff::16", 0xffff, 0x0b1b),
        group("ff12:401b:ffff::16", 0xffff, 0x0b1b),
        group("ff12:601b:ffff::2", 0xffff, 0x0b1b),
        group("ff12::1", 0xffff, 0xdead_beef),
        group("ff12:401b:8001::ffff:ffff", 0x8001, 0x0b1b),
    ];
    assert_eq!(d.groups, expected);
    assert_eq!(d.warnings.len(), 1, "{:#?}", d.warnings);
    warned(&d, 15, 18, "UFM manual's form");
}

#[test]
fn the_ufm_manuals_ufm_example_splits_one_partition() {
    let text = fixture("ufm_manual_split.conf");
    for guid in [0x8f10001072a41, 0x8f10001072a44, 0x8f10001072a45] {
        let d = ok_for(&text, guid, false);
        assert_eq!(d.pkeys, [0x7fff, 0x8004]);
        assert_eq!(d.names, ["Default", "IOPartition"]);
        assert_eq!(
            d.groups,
            [group("ff12:401b:8004::ffff:ffff", 0x8004, 0x0b1b)]
        );
    }
    let d = ok_for(&text, 0x8f10001072a46, false);
    assert_eq!((d.pkeys, d.groups), (vec![0x7fff], vec![]));
}

// Size.

#[test]
fn a_plan_of_32768_partitions_and_100000_guids() {
    const PARTITIONS: usize = 32_768;
    const GUIDS: usize = 100_000;
    const BASE: u64 = 0x0002_c903_0000_0000;
    let mut text = String::with_capacity(4 << 20);
    for i in 0..PARTITIONS {
        let ipoib = if i % 2 == 0 { ", ipoib" } else { "" };
        write!(text, "P{i}=0x{:04x}{ipoib} :", i % 0x7fff + 1).unwrap();
        for n in (i..GUIDS).step_by(PARTITIONS) {
            write!(text, " 0x{:x},", BASE + n as u64).unwrap();
        }
        text.push_str(if i % 1000 == 0 {
            " ALL_CAS ;\n"
        } else {
            " ;\n"
        });
    }
    let d = ok_for(&text, BASE + 5, false);
    // P0 and P32767 share 0x0001; P32766 is 0x7fff, the default partition.
    let mut expected = vec![0x7fff, 0x0001, 0x0006];
    expected.extend((1..33).map(|k| k * 1000 + 1));
    assert_eq!(d.pkeys, expected);
    assert_eq!(d.names[..4], ["Default", "P0", "P5", "P1000"]);
    assert_eq!(d.groups.len(), 1 + 33);
    assert_eq!(
        d.groups[0],
        group("ff12:401b:ffff::ffff:ffff", 0x7fff, 0x0b1b)
    );
    assert_eq!(d.warnings.len(), 1, "{:#?}", d.warnings);
}

// Properties.

/// Prints a derivation as a file that derives it again for `guid`: one
/// definition per partition in table order, naming the port by GUID, with
/// each group's scope and Q_Key spelled out.
fn canonical(d: &Derived, guid: u64) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < d.pkeys.len() {
        let (pkey, key) = (d.pkeys[i], d.pkeys[i] & 0x7fff);
        let both = pkey != key && d.pkeys.get(i + 1) == Some(&key);
        let membership = match (both, pkey != key) {
            (true, _) => "both",
            (false, true) => "full",
            (false, false) => "limited",
        };
        let indx0 = if i == 0 && key != 0x7fff {
            ", indx0"
        } else {
            ""
        };
        writeln!(out, "{}=0x{key:04x}{indx0} :", d.names[i]).unwrap();
        for g in d.groups.iter().filter(|g| g.pkey & 0x7fff == key) {
            write!(out, "  mgid={},scope={}", g.mgid, g.mgid.octets()[1] & 0x0f).unwrap();
            if g.qkey != 0 {
                write!(out, ",Q_Key=0x{:x}", g.qkey).unwrap();
            }
            out.push('\n');
        }
        writeln!(out, "  0x{guid:x}={membership} ;").unwrap();
        i += 1 + usize::from(both);
    }
    out
}

fn round_trips(d: &Derived, guid: u64, is_sm: bool) -> Result<(), TestCaseError> {
    let text = canonical(d, guid);
    let again = run(&text, guid, is_sm).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
    prop_assert_eq!(&again.pkeys, &d.pkeys, "{}", text);
    prop_assert_eq!(&again.names, &d.names, "{}", text);
    prop_assert_eq!(&again.groups, &d.groups, "{}", text);
    prop_assert_eq!(canonical(&again, guid), text);
    Ok(())
}

const TOKENS: &[&str] = &[
    "Default",
    "P",
    "Q",
    "=",
    "0x7fff",
    "0x10",
    "0x8010",
    "0x18001",
    "0",
    "017",
    "16",
    "0x123456",
    "1193046",
    ",",
    ":",
    ";",
    " ",
    " ",
    "\n",
    "\t",
    "# c\n",
    "ipoib",
    "ip",
    "defmember",
    "defmem",
    "full",
    "limited",
    "lim",
    "both",
    "b",
    "indx0",
    "ALL",
    "ALL_CAS",
    "ALL_SWITCHES",
    "ALL_ROUTERS",
    "SELF",
    "NONE",
    "A",
    "S",
    "mgid",
    "ff12:401b::1",
    "ff12::1",
    "ff15::2",
    "fe80::1",
    "ff12:401b:8010::3",
    "mtu",
    "rate",
    "scope",
    "Q_Key",
    "qkey",
    "sl",
    "FlowLabel",
    "TClass",
    "tclass",
    "1",
    "2",
    "3",
    "4",
    "5",
    "\r",
    "é",
    "\u{0}",
];

/// Pieces of definitions, mostly right, for soups a good share of which is
/// accepted: (right pieces, wrong pieces).
const HEADS: (&[&str], &[&str]) = (
    &[
        "Default=0x7fff",
        "P=0x10",
        "P=0x8010 ",
        "Q = 0x20",
        "Q",
        "=0x30",
        "0x40",
        "",
        "P=0x10, ipoib",
        "Q, indx0",
        "R=0x50,indx0",
        "P=0x10, defmember=full",
        ", defmem=both",
        "P=0x10, scope=5, Q_Key=0x9",
        "S=0x60, mtu=5, rate=6",
        "P=0x10, sl=1, TClass=2, FlowLabel=3",
        "Q=0x20 : defmember=full ",
    ],
    &["P=0x18001", "P=017", "P=0x10\n", "P=0x10,,", "P=0x10 # c\n"],
);
const MEMBERS: (&[&str], &[&str]) = (
    &[
        "ALL",
        "ALL_CAS",
        "ALL_SWITCHES",
        "SELF",
        "NONE",
        "A",
        "0x123456",
        "1193046",
        "0x123456=full",
        "0x123456 = both",
        "ALL=lim",
        "0x1",
        "mgid=ff12:401b::1\n",
        "mgid=ff12::1,Q_Key=5\n",
        "mgid=ff15::2,scope=5\n",
        "# c\n",
    ],
    &[
        "mgid=ff12:401b::3,rate=6\n",
        "mgid=ff12:401b:8010::4\n",
        "=",
        "0",
        "\r",
        "é",
    ],
);
const SEPARATORS: (&[&str], &[&str]) = (&[",", ", ", "\n ", ",\n "], &[" ", "", ",,"]);
const ENDS: (&[&str], &[&str]) = (&[";\n", " ;", ";", "\n;\n"], &["", ":;"]);

/// Mostly a right piece, now and then a wrong one.
fn piece(
    (right, wrong): (&'static [&'static str], &'static [&'static str]),
) -> BoxedStrategy<&'static str> {
    prop_oneof![12 => select(right), 1 => select(wrong)].boxed()
}

fn definition_soup() -> impl Strategy<Value = String> {
    // A piece that ends its line needs no separator.
    let member = (piece(MEMBERS), piece(SEPARATORS))
        .prop_map(|(m, s)| format!("{m}{}", if m.ends_with('\n') { " " } else { s }));
    let def = (piece(HEADS), vec(member, 0..6), piece(ENDS))
        .prop_map(|(head, members, end)| format!("{head}:{}{end}", members.concat()));
    vec(def, 0..5).prop_map(|defs| defs.concat())
}

/// Member words a plan uses: `PORT` is the port's GUID, `OTHER` another.
const WHO: [&str; 8] = [
    "ALL",
    "ALL_CAS",
    "ALL_SWITCHES",
    "ALL_ROUTERS",
    "SELF",
    "NONE",
    "PORT",
    "OTHER",
];
const MEMBERSHIP: [&str; 3] = ["limited", "full", "both"];
/// Names of the explicitly keyed partitions; none is `Default`, `g4` or
/// `g5`, which definitions without a P_Key look up.
const NAMES: [&str; 6] = ["", "Storage", "compute", "x_1", "ib-a", "Ωmega"];

fn short(word: &'static str) -> &'static str {
    match word {
        "ALL_CAS" => "ALL_C",
        "ALL_SWITCHES" => "ALL_S",
        "ALL_ROUTERS" => "ALL_R",
        "SELF" => "SE",
        "NONE" => "NO",
        "limited" => "lim",
        "full" => "fu",
        "both" => "b",
        "defmember" => "defmem",
        "ipoib" => "ip",
        "scope" => "sco",
        "Q_Key" => "Q_",
        _ => word,
    }
}

/// One definition of a plan.
#[derive(Clone, Debug)]
struct Def {
    /// 0: Default; 1-3: explicitly keyed; 4-5: generated (named g4, g5).
    part: usize,
    /// How to write the header's name and P_Key.
    header: usize,
    ipoib: bool,
    defmember: Option<usize>,
    /// Write `defmember` between two colons.
    manual_form: bool,
    /// Indices into WHO and MEMBERSHIP.
    members: Vec<(usize, Option<usize>)>,
    /// IP or not, scope nibble written, scope flag, Q_Key flag.
    groups: Vec<(bool, u8, Option<u8>, Option<u32>)>,
}

#[derive(Clone, Debug)]
struct Style {
    abbreviate: bool,
    /// 0: `, `; 1: `,` and a new line; 2: a new line.
    separator: usize,
    comments: bool,
    /// Around `=`, `,` and `:`.
    blank: &'static str,
    decimal: bool,
}

#[derive(Clone, Debug)]
struct Plan {
    keys: Vec<u16>,
    names: Vec<usize>,
    /// Per partition, in every definition of it.
    qkeys: Vec<Option<u32>>,
    scopes: Vec<Option<u8>>,
    /// The partition all of whose definitions say indx0.
    indx0: Option<usize>,
    defs: Vec<Def>,
    is_sm: bool,
    style: Style,
}

fn def() -> impl Strategy<Value = Def> {
    let members = vec((0..WHO.len(), proptest::option::of(0..3usize)), 0..5);
    let groups = vec(
        (
            any::<bool>(),
            1..16u8,
            proptest::option::of(1..16u8),
            proptest::option::of(1..=u32::MAX),
        ),
        0..3,
    );
    (
        0..6usize,
        0..3usize,
        any::<bool>(),
        proptest::option::of(0..3usize),
        any::<bool>(),
        members,
        groups,
    )
        .prop_map(
            |(part, header, ipoib, defmember, manual_form, members, groups)| Def {
                part,
                header,
                ipoib,
                defmember,
                manual_form,
                members,
                groups,
            },
        )
}

fn plan() -> impl Strategy<Value = Plan> {
    let style = (
        any::<bool>(),
        0..3usize,
        any::<bool>(),
        select(vec!["", " ", "\t"]),
        any::<bool>(),
    )
        .prop_map(|(abbreviate, separator, comments, blank, decimal)| Style {
            abbreviate,
            separator,
            comments,
            blank,
            decimal,
        });
    (
        proptest::collection::btree_set(0x100..0x7000u16, 3),
        vec(0..NAMES.len(), 3),
        vec(proptest::option::of(1..=u32::MAX), 6),
        vec(proptest::option::of(1..16u8), 6),
        proptest::option::of(1..6usize),
        vec(def(), 0..10),
        any::<bool>(),
        style,
    )
        .prop_map(
            |(keys, names, qkeys, scopes, indx0, defs, is_sm, style)| Plan {
                keys: keys.into_iter().collect(),
                names,
                qkeys,
                scopes,
                indx0,
                defs,
                is_sm,
                style,
            },
        )
}

impl Plan {
    fn word(&self, word: &'static str) -> &'static str {
        if self.style.abbreviate {
            short(word)
        } else {
            word
        }
    }

    fn name(&self, part: usize) -> String {
        match part {
            0 => "Default".into(),
            1..=3 => NAMES[self.names[part - 1]].into(),
            _ => format!("g{part}"),
        }
    }

    fn render(&self) -> String {
        let mut out = String::new();
        let mut next_group = 0;
        for def in &self.defs {
            self.render_def(def, &mut next_group, &mut out);
        }
        out
    }

    fn render_def(&self, def: &Def, next_group: &mut u32, out: &mut String) {
        let b = self.style.blank;
        let nl = if self.style.comments {
            " # note\n"
        } else {
            "\n"
        };
        out.push_str(&self.header(def));
        let mut flag = |name: &'static str, value: Option<String>| {
            write!(out, "{b},{b}{}", self.word(name)).unwrap();
            if let Some(value) = value {
                write!(out, "{b}={b}{value}").unwrap();
            }
        };
        if def.ipoib {
            flag("ipoib", None);
        }
        if self.indx0 == Some(def.part) {
            flag("indx0", None);
        }
        if let Some(qkey) = self.qkeys[def.part] {
            flag("Q_Key", Some(format!("0x{qkey:x}")));
        }
        if let Some(scope) = self.scopes[def.part] {
            flag("scope", Some(scope.to_string()));
        }
        let defmember = def.defmember.map(|m| self.word(MEMBERSHIP[m]).to_string());
        match defmember {
            Some(m) if def.manual_form => {
                write!(out, "{b}:{b}{}={m}{b}:{nl}", self.word("defmember")).unwrap()
            }
            m => {
                if m.is_some() {
                    flag("defmember", m);
                }
                write!(out, "{b}:{nl}").unwrap();
            }
        }
        for &(ip, nibble, scope, qkey) in &def.groups {
            *next_group += 1;
            let signature = if ip { ":401b" } else { "" };
            write!(
                out,
                "  mgid{b}={b}ff1{nibble:x}{signature}::{:x}",
                *next_group
            )
            .unwrap();
            if let Some(scope) = scope {
                write!(out, "{b},{b}{}={scope}", self.word("scope")).unwrap();
            }
            if let Some(qkey) = qkey {
                write!(out, ",{}=0x{qkey:x}", self.word("Q_Key")).unwrap();
            }
            out.push_str(nl);
        }
        let separator = match self.style.separator {
            0 => format!("{b},{b}"),
            1 => format!(",{nl}  "),
            _ => format!("{nl}  "),
        };
        let members: Vec<String> = def.members.iter().map(|&m| self.member(m)).collect();
        writeln!(out, "  {}{b};", members.join(&separator)).unwrap();
    }

    fn header(&self, def: &Def) -> String {
        let b = self.style.blank;
        match def.part {
            0 => ["Default=0x7fff", "Default", "=0xffff"][def.header].into(),
            1..=3 => {
                let key = self.keys[def.part - 1];
                let key = match def.header {
                    0 => format!("0x{key:04x}"),
                    1 => format!("0x{:04x}", key | 0x8000),
                    _ => key.to_string(),
                };
                match self.name(def.part) {
                    name if name.is_empty() && def.header == 0 => key,
                    name => format!("{name}{b}={b}{key}"),
                }
            }
            part => format!("g{part}"),
        }
    }

    fn member(&self, (who, membership): (usize, Option<usize>)) -> String {
        let mut member = match WHO[who] {
            "PORT" if self.style.decimal => PORT.to_string(),
            "PORT" => format!("0x{PORT:x}"),
            "OTHER" => "0xabcdef".into(),
            word => self.word(word).into(),
        };
        if let (Some(m), false) = (membership, WHO[who] == "NONE") {
            write!(
                member,
                "{b}={b}{}",
                self.word(MEMBERSHIP[m]),
                b = self.style.blank
            )
            .unwrap();
        }
        member
    }

    /// What the plan gives the port, worked out without the parser: the
    /// best membership per partition, in order of first appearance after
    /// the implicit default, indx0's partition first if it names the port.
    fn model(&self) -> (Vec<u16>, Vec<String>) {
        let mut member = [None; 6];
        member[0] = Some(usize::from(self.is_sm));
        let mut keys = [0x7fff, self.keys[0], self.keys[1], self.keys[2], 0, 0];
        let mut order = vec![0];
        let mut indx0_hit = false;
        let mut generated = 0;
        for def in &self.defs {
            if !order.contains(&def.part) {
                order.push(def.part);
                if def.part >= 4 {
                    generated += 1;
                    keys[def.part] = generated;
                }
            }
            let names_port = |&&(who, _): &&(usize, Option<usize>)| match WHO[who] {
                "ALL" | "ALL_CAS" | "PORT" => true,
                "SELF" => self.is_sm,
                _ => false,
            };
            let mention = def
                .members
                .iter()
                .filter(names_port)
                .map(|&(_, m)| m.or(def.defmember).unwrap_or(0))
                .max();
            member[def.part] = member[def.part].max(mention);
            indx0_hit |= mention.is_some() && self.indx0 == Some(def.part);
        }
        if let (true, Some(first)) = (indx0_hit, self.indx0) {
            order.retain(|&p| p != first);
            order.insert(0, first);
        }
        let (mut pkeys, mut names) = (Vec::new(), Vec::new());
        for part in order {
            let entries: &[u16] = match member[part] {
                None => &[],
                Some(0) => &[keys[part]],
                Some(1) => &[keys[part] | 0x8000],
                Some(_) => &[keys[part] | 0x8000, keys[part]],
            };
            for &pkey in entries {
                pkeys.push(pkey);
                names.push(self.name(part));
            }
        }
        (pkeys, names)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..512), is_sm: bool) {
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(d) = run(&text, PORT, is_sm) {
            round_trips(&d, PORT, is_sm)?;
        }
    }

    #[test]
    fn token_soup_never_panics_and_what_is_accepted_round_trips(
        tokens in vec(select(TOKENS), 0..64),
        is_sm: bool,
    ) {
        let text = tokens.concat();
        if let Ok(d) = run(&text, PORT, is_sm) {
            round_trips(&d, PORT, is_sm)?;
        }
    }

    #[test]
    fn definition_soup_never_panics_and_what_is_accepted_round_trips(
        text in definition_soup(),
        is_sm: bool,
    ) {
        if let Ok(d) = run(&text, PORT, is_sm) {
            round_trips(&d, PORT, is_sm)?;
        }
    }

    #[test]
    fn plans_are_accepted_derive_as_modelled_and_round_trip(plan in plan()) {
        let text = plan.render();
        let d = run(&text, PORT, plan.is_sm).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let (pkeys, names) = plan.model();
        prop_assert_eq!(&d.pkeys, &pkeys, "{}", text);
        prop_assert_eq!(&d.names, &names, "{}", text);
        round_trips(&d, PORT, plan.is_sm)?;
    }
}

#[test]
fn the_canonical_print_of_the_ufm_manuals_examples_round_trips() {
    let text = fixture("ufm_manual_examples.conf");
    for (guid, is_sm) in [(0x123456, false), (0x1, true), (0x12345c, false)] {
        let d = ok_for(&text, guid, is_sm);
        round_trips(&d, guid, is_sm).unwrap();
    }
}
