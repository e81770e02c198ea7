//! OpenSM's `partitions.conf`, reduced to one port's share: the P_Key table
//! OpenSM's Partition Manager would program into this CA port, and the
//! multicast groups of its partitions. Where OpenSM logs a warning and
//! carries on (unknown flags and words, bad or truncated numbers, a missing
//! `;`), this parser refuses the whole file: a firewall must not guess.
//!
//! Semantics follow linux-rdma/opensm `osm_prtn_config.c` and `osm_prtn.c`:
//! - the default partition exists before the file is read, as
//!   `Default=0x7fff : ALL=limited, SELF=full` (`prtn_make_default`); rules
//!   for 0x7fff merge into it, so a CA port is always at least a limited
//!   member and has an entry at index 0 unless a partition says `indx0`;
//! - a definition without a P_Key joins the earlier partition of that name,
//!   else takes the next P_Key counting up from 0x0001 that no partition
//!   defined so far uses (`generate_pkey`);
//! - keywords, flags and memberships match by prefix, first match in
//!   OpenSM's order (`strncmp(word, name, strlen(word))`);
//! - an `mgid=` entry runs to the end of its line; OpenSM sets its scope
//!   nibble (2 unless `scope=`) and, for IP groups, its P_Key bits.

use std::{collections::HashMap, fmt, net::Ipv6Addr, path::Path};

use pkeyfw_common::pkey::{FULL, KEY_MASK};

use super::error::position;

/// Whose P_Key table to derive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// This CA port's GUID.
    pub port_guid: u64,
    /// Whether the SM runs on this port: `SELF` names it only then.
    pub is_sm: bool,
}

/// One port's share of the partition plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Derived {
    /// The port's P_Key table in index order. Index 0 is the default
    /// partition's entry unless a partition naming this port says `indx0`;
    /// the rest follow their partitions' first appearance in the file, a
    /// `both` member's full entry before its limited one.
    pub pkeys: Vec<u16>,
    /// The partition name of each `pkeys` entry (empty when unnamed).
    pub names: Vec<String>,
    /// Multicast groups of partitions with an entry here, in table order of
    /// their partitions, then file order.
    pub groups: Vec<DerivedGroup>,
    /// `FILE:LINE:COL: message` for what OpenSM reads differently or
    /// accepts only by abbreviation.
    pub warnings: Vec<String>,
}

/// A multicast group this port may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DerivedGroup {
    /// As OpenSM creates it: scope nibble and IP P_Key bits filled in.
    pub mgid: Ipv6Addr,
    /// This port's entry for the group's partition (the full one if `both`).
    pub pkey: u16,
    pub qkey: u32,
}

/// A refused file: where, and what was expected there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionsError {
    pub file: String,
    /// 1-based; the column counts bytes.
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl fmt::Display for PartitionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.file, self.line, self.column, self.message
        )
    }
}

impl std::error::Error for PartitionsError {}

/// Derives this port's P_Key table from `partitions.conf` text; `path` names
/// the file in errors and warnings. Any error refuses the whole file.
pub fn derive(path: &Path, text: &str, opts: &Options) -> Result<Derived, PartitionsError> {
    let mut parser = Parser::new(path, text, *opts);
    parser.check_line_lengths()?;
    while parser.more() {
        parser.definition()?;
    }
    Ok(parser.finish())
}

/// Longest line OpenSM reads whole: `fgets` into 4096 bytes less one. It
/// splits longer lines wherever its buffer ends, GUIDs included.
const MAX_LINE: usize = 4094;
/// Longest partition name OpenSM keeps (`char name[32]`); it cuts longer
/// ones and then no longer finds them by name.
const MAX_NAME: usize = 31;
const DEFAULT_KEY: u16 = 0x7fff;
/// The implicit default partition is created first.
const DEFAULT_PART: usize = 0;
/// The last P_Key `generate_pkey` hands out.
const LAST_GENERATED: u16 = 0x7ffe;
/// `OSM_IPOIB_BROADCAST_MGRP_QKEY`.
const IPOIB_QKEY: u32 = 0x0b1b;
/// `OSM_DEFAULT_MGRP_SCOPE`: link-local.
const DEFAULT_SCOPE: u8 = 2;
/// `OSM_DEFAULT_MGRP_RATE`: 10 Gb/s.
const DEFAULT_RATE: u8 = 3;
/// `OSM_DEFAULT_MGRP_MTU`: 2048.
const DEFAULT_MTU: u8 = 4;
/// `osm_ipoib_broadcast_mgid`, before OpenSM fills in the P_Key bits.
const IPOIB_BROADCAST: Ipv6Addr = Ipv6Addr::new(0xff12, 0x401b, 0xffff, 0, 0, 0, 0xffff, 0xffff);
const MEMBER_WORDS: &str =
    "a port GUID, ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS, SELF, NONE or mgid=";

/// A value and the byte offset it was written at.
type At<T> = (T, usize);

/// Ordered so that merging mentions of a port is `max`: full beats limited,
/// `both` beats either.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Membership {
    #[default]
    Limited,
    Full,
    Both,
}

/// In OpenSM's order of matching (`partition_add_port`).
const MEMBERSHIPS: [(&str, Membership); 3] = [
    ("full", Membership::Full),
    ("both", Membership::Both),
    ("limited", Membership::Limited),
];

/// Whom a member entry names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Who {
    Nobody,
    All,
    Cas,
    Switches,
    Routers,
    Sm,
    Guid(u64),
}

/// In OpenSM's order of matching (`partition_add_port`).
const KEYWORDS: [(&str, Who); 6] = [
    ("NONE", Who::Nobody),
    ("ALL", Who::All),
    ("ALL_CAS", Who::Cas),
    ("ALL_SWITCHES", Who::Switches),
    ("ALL_ROUTERS", Who::Routers),
    ("SELF", Who::Sm),
];

/// Flags a multicast group takes, in a partition header or an `mgid=` entry.
#[derive(Clone, Copy, PartialEq, Eq)]
enum GroupFlag {
    Mtu,
    Rate,
    Scope,
    QKey,
    TClass,
    Sl,
    FlowLabel,
}

/// In OpenSM's order of matching (`parse_group_flag`).
const GROUP_FLAGS: [(&str, GroupFlag); 7] = [
    ("mtu", GroupFlag::Mtu),
    ("rate", GroupFlag::Rate),
    ("scope", GroupFlag::Scope),
    ("Q_Key", GroupFlag::QKey),
    ("TClass", GroupFlag::TClass),
    ("sl", GroupFlag::Sl),
    ("FlowLabel", GroupFlag::FlowLabel),
];

impl GroupFlag {
    /// The values the flag takes, and how to say so.
    fn range(self) -> (u64, u64, &'static str) {
        match self {
            GroupFlag::Mtu => (1, 5, "an MTU code from 1 (256) to 5 (4096)"),
            GroupFlag::Rate => (2, 24, "a rate code from 2 (2.5 Gb/s) to 24 (1200 Gb/s)"),
            GroupFlag::Scope => (1, 15, "a scope from 1 to 15"),
            GroupFlag::QKey => (1, u32::MAX.into(), "a nonzero 32-bit Q_Key"),
            GroupFlag::TClass => (0, 255, "a traffic class from 0 to 255"),
            GroupFlag::Sl => (0, 15, "a service level from 0 to 15"),
            GroupFlag::FlowLabel => (0, 0xf_ffff, "a 20-bit flow label"),
        }
    }
}

/// Flags of a partition definition.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flag {
    Group(GroupFlag),
    Ipoib,
    DefMember,
    Indx0,
}

/// Matched after the group flags (`partition_add_flag`); `indx0` only whole.
const PARTITION_FLAGS: [(&str, Flag); 2] = [("ipoib", Flag::Ipoib), ("defmember", Flag::DefMember)];

/// The first of `table`'s names that `word` abbreviates, as OpenSM's
/// `strncmp` chains pick them.
fn abbreviates<T: Copy>(word: &str, table: &[(&'static str, T)]) -> Option<(&'static str, T)> {
    table
        .iter()
        .copied()
        .find(|(name, _)| !word.is_empty() && name.starts_with(word))
}

/// A group flag by OpenSM's prefix match, or by the UFM manual's lowercase
/// spellings `qkey` and `tclass`.
fn group_flag_named(word: &str) -> Option<(&'static str, GroupFlag)> {
    abbreviates(word, &GROUP_FLAGS).or(match word {
        "qkey" => Some(("Q_Key", GroupFlag::QKey)),
        "tclass" => Some(("TClass", GroupFlag::TClass)),
        _ => None,
    })
}

fn partition_flag_named(word: &str) -> Option<(&'static str, Flag)> {
    group_flag_named(word)
        .map(|(name, g)| (name, Flag::Group(g)))
        .or_else(|| abbreviates(word, &PARTITION_FLAGS))
        .or((word == "indx0").then_some(("indx0", Flag::Indx0)))
}

fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Names stop at delimiters and white space (so `Foo Bar` is refused rather
/// than taken as one name, as OpenSM would); other bytes are allowed.
fn is_name_byte(c: u8) -> bool {
    !c.is_ascii_control() && !matches!(c, b' ' | b'=' | b',' | b':' | b';' | b'#')
}

fn is_gid_byte(c: u8) -> bool {
    c.is_ascii_hexdigit() || c == b':' || c == b'.'
}

/// IPoIB (IPv4 or IPv6) signature, as OpenSM's `mgid_is_ip` tests it.
fn is_ip_group(mgid: &[u8; 16]) -> bool {
    matches!(mgid[2..4], [0x40 | 0x60, 0x1b])
}

/// A partition's entries in this port's table: the full one first if `both`.
fn entries(key: u16, m: Membership) -> impl Iterator<Item = u16> {
    let first = if m == Membership::Limited {
        key
    } else {
        key | FULL
    };
    std::iter::once(first).chain((m == Membership::Both).then_some(key))
}

/// What a multicast group inherits from its partition's flags.
#[derive(Clone, Copy)]
struct GroupFlags {
    mtu: u8,
    rate: u8,
    /// Bit n: create the group with scope n; none means link-local.
    scopes: u16,
    /// 0: the default for the kind of group.
    qkey: u32,
}

impl Default for GroupFlags {
    fn default() -> Self {
        GroupFlags {
            mtu: DEFAULT_MTU,
            rate: DEFAULT_RATE,
            scopes: 0,
            qkey: 0,
        }
    }
}

/// One definition's flags; they end with its `;`.
#[derive(Default)]
struct Flags {
    group: GroupFlags,
    ipoib_at: Option<usize>,
    defmember: Membership,
    indx0_at: Option<usize>,
    /// Flags given so far, to refuse repeats.
    seen: Vec<&'static str>,
}

struct Partition<'a> {
    name: &'a str,
    key: u16,
    /// Where the key was generated, if it was.
    generated_at: Option<usize>,
    /// This port's membership, if it has any.
    member: Option<Membership>,
    /// Indices into `Parser::groups`.
    groups: Vec<usize>,
}

struct Group {
    mgid: Ipv6Addr,
    qkey: u32,
    part: usize,
    at: usize,
}

/// Which partitions carry a name, for definitions without a P_Key.
#[derive(Clone, Copy)]
enum Named {
    One(usize),
    Several,
}

/// A single pass over the text; `pos` is always on a character boundary.
struct Parser<'a> {
    path: &'a Path,
    text: &'a str,
    pos: usize,
    opts: Options,
    parts: Vec<Partition<'a>>,
    by_key: HashMap<u16, usize>,
    by_name: HashMap<&'a str, Named>,
    last_generated: u16,
    groups: Vec<Group>,
    by_mgid: HashMap<Ipv6Addr, usize>,
    /// The partition whose entry goes to index 0, and where it said so.
    indx0: Option<At<usize>>,
    /// The first rule for the default partition, and whether any names us.
    default_rule: Option<usize>,
    default_named: bool,
    /// Warnings by byte offset; located once at the end.
    notes: Vec<(usize, String)>,
}

impl<'a> Parser<'a> {
    /// Starts with OpenSM's implicit `Default=0x7fff : ALL=limited,
    /// SELF=full`: ALL includes this CA port, SELF makes it full if the SM.
    fn new(path: &'a Path, text: &'a str, opts: Options) -> Self {
        let mut parser = Parser {
            path,
            text,
            pos: 0,
            opts,
            parts: Vec::new(),
            by_key: HashMap::new(),
            by_name: HashMap::new(),
            last_generated: 0,
            groups: Vec::new(),
            by_mgid: HashMap::new(),
            indx0: None,
            default_rule: None,
            default_named: false,
            notes: Vec::new(),
        };
        let default = parser.create("Default", DEFAULT_KEY, None);
        let membership = if opts.is_sm {
            Membership::Full
        } else {
            Membership::Limited
        };
        parser.parts[default].member = Some(membership);
        parser
    }

    fn check_line_lengths(&self) -> Result<(), PartitionsError> {
        let mut start = 0;
        for line in self.text.split('\n') {
            if line.len() > MAX_LINE {
                let cut = (0..=MAX_LINE)
                    .rev()
                    .find(|&i| line.is_char_boundary(i))
                    .unwrap_or(0);
                return Err(self.err(
                    start + cut,
                    format!(
                        "line is {} bytes long: expected at most {MAX_LINE} (OpenSM reads \
                         longer lines in pieces, splitting them here)",
                        line.len()
                    ),
                ));
            }
            start += line.len() + 1;
        }
        Ok(())
    }

    /// `Header : [flags :] members ;`
    fn definition(&mut self) -> Result<(), PartitionsError> {
        let start = self.pos;
        let (name, key) = self.name_and_key()?;
        let mut flags = Flags::default();
        self.header_flags(&mut flags)?;
        self.manual_form_flags(&mut flags)?;
        let part = self.partition(name, key, start)?;
        if let Some(at) = flags.ipoib_at {
            self.broadcast_group(part, flags.group, at)?;
        }
        let mention = self.members(part, &flags, start)?;
        self.close(part, mention, &flags, start)
    }

    /// `[PartitionName][=PKey]`, or a bare P_Key: OpenSM takes a name that
    /// starts with a digit for one.
    fn name_and_key(&mut self) -> Result<(&'a str, Option<At<u16>>), PartitionsError> {
        let (name, at) = self.take(is_name_byte);
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            return Ok(("", Some((self.pkey(name, at)?, at))));
        }
        if name.len() > MAX_NAME {
            return Err(self.err(
                at,
                format!(
                    "partition name is {} bytes long: expected at most {MAX_NAME} (OpenSM cuts \
                     it, then no longer finds the partition by name)",
                    name.len()
                ),
            ));
        }
        self.skip_blanks();
        if !self.eat(b'=') {
            return Ok((name, None));
        }
        let (word, at) = self.value("a P_Key after `=`")?;
        Ok((name, Some((self.pkey(word, at)?, at))))
    }

    /// `(, flag[=value])* :`, all on the line the definition starts on:
    /// OpenSM looks for the `:` on that line only.
    fn header_flags(&mut self, flags: &mut Flags) -> Result<(), PartitionsError> {
        loop {
            self.skip_blanks();
            if self.eat(b':') {
                return Ok(());
            }
            if !self.eat(b',') {
                return Err(self.expected(
                    "`,` and a flag, or `:`, on the line the partition definition starts",
                ));
            }
            self.flag(flags)?;
        }
    }

    /// The UFM manual's `ShareIO = 0x80 : defmember=limited : members` form:
    /// flags after the first `:`, closed by a second one.
    fn manual_form_flags(&mut self, flags: &mut Flags) -> Result<(), PartitionsError> {
        self.skip_blanks();
        let start = self.pos;
        let (word, at) = self.take(is_word_byte);
        self.pos = start;
        if partition_flag_named(word).is_none() {
            return Ok(());
        }
        self.note(
            at,
            "flags between two `:` are the UFM manual's form; upstream OpenSM reads them as a port \
             GUID and rejects the file: write `Name=PKey, flags : members`",
        );
        loop {
            self.flag(flags)?;
            self.skip_blanks();
            if self.eat(b':') {
                return Ok(());
            }
            if !self.eat(b',') {
                return Err(self.expected("`,` and a flag, or the second `:` before the members"));
            }
        }
    }

    /// One partition flag, `name[=value]`.
    fn flag(&mut self, flags: &mut Flags) -> Result<(), PartitionsError> {
        let expected = "a partition flag: ipoib, defmember, indx0, mtu, rate, sl, scope, Q_Key, \
                        TClass or FlowLabel";
        let (name, flag, at) = self.flag_name(partition_flag_named, &mut flags.seen, expected)?;
        let value = self.flag_value(name)?;
        match flag {
            Flag::Group(g) => self.group_flag(&mut flags.group, g, self.need(value, name)?),
            Flag::DefMember => {
                let (word, at) = self.need(value, name)?;
                flags.defmember = self.membership(word, at)?;
                Ok(())
            }
            Flag::Ipoib => self
                .no_value(value, name)
                .map(|()| flags.ipoib_at = Some(at)),
            Flag::Indx0 => self
                .no_value(value, name)
                .map(|()| flags.indx0_at = Some(at)),
        }
    }

    /// Reads and resolves a flag name, warning about abbreviations and
    /// refusing repeats (OpenSM silently keeps the last; only scopes add up).
    fn flag_name<T>(
        &mut self,
        lookup: fn(&str) -> Option<(&'static str, T)>,
        seen: &mut Vec<&'static str>,
        expected: &str,
    ) -> Result<(&'static str, T, usize), PartitionsError> {
        self.skip_blanks();
        let (word, at) = self.take(is_word_byte);
        let Some((name, flag)) = lookup(word) else {
            return Err(match word {
                "" => self.expected(expected),
                _ => self.err(at, format!("unknown flag `{word}`: expected {expected}")),
            });
        };
        if name != "scope" && seen.contains(&name) {
            return Err(self.err(
                at,
                format!("`{name}` given twice: expected it once (OpenSM silently keeps the last)"),
            ));
        }
        seen.push(name);
        self.spelled(word, name, at);
        Ok((name, flag, at))
    }

    /// `=value` after a flag name, if there is one.
    fn flag_value(&mut self, name: &str) -> Result<Option<At<&'a str>>, PartitionsError> {
        self.skip_blanks();
        if !self.eat(b'=') {
            return Ok(None);
        }
        self.value(&format!("a value for `{name}`")).map(Some)
    }

    fn need<T>(&self, value: Option<T>, name: &str) -> Result<T, PartitionsError> {
        value.ok_or_else(|| self.expected(&format!("`=` and a value after `{name}`")))
    }

    fn no_value(&self, value: Option<At<&str>>, name: &str) -> Result<(), PartitionsError> {
        match value {
            Some((_, at)) => Err(self.err(at, format!("`{name}` takes no value"))),
            None => Ok(()),
        }
    }

    /// Checks a group flag's value; SL, traffic class and flow label are
    /// only checked, as they do not change who may talk.
    fn group_flag(
        &self,
        flags: &mut GroupFlags,
        flag: GroupFlag,
        (word, at): At<&str>,
    ) -> Result<(), PartitionsError> {
        let (low, high, what) = flag.range();
        let value = self.number(word, at, what)?;
        if !(low..=high).contains(&value) {
            return Err(self.err(at, format!("expected {what}, found {word}")));
        }
        match flag {
            GroupFlag::Mtu => flags.mtu = value as u8,
            GroupFlag::Rate => flags.rate = value as u8,
            GroupFlag::Scope => flags.scopes |= 1 << value,
            GroupFlag::QKey => flags.qkey = value as u32,
            GroupFlag::TClass | GroupFlag::Sl | GroupFlag::FlowLabel => {}
        }
        Ok(())
    }

    fn membership(&mut self, word: &str, at: usize) -> Result<Membership, PartitionsError> {
        let Some((name, m)) = abbreviates(word, &MEMBERSHIPS) else {
            return Err(self.err(
                at,
                format!("unknown membership `{word}`: expected full, limited or both"),
            ));
        };
        self.spelled(word, name, at);
        Ok(m)
    }

    /// The partition a definition adds to: by P_Key, else by name, else a
    /// new one with a generated P_Key.
    fn partition(
        &mut self,
        name: &'a str,
        key: Option<At<u16>>,
        at: usize,
    ) -> Result<usize, PartitionsError> {
        if let Some((key, key_at)) = key {
            return match self.by_key.get(&key) {
                None => Ok(self.create(name, key, None)),
                Some(&i) => match self.parts[i].generated_at {
                    None => Ok(i),
                    Some(generated_at) => Err(self.err(
                        key_at,
                        format!(
                            "P_Key 0x{key:04x} was generated for {} on line {}, and OpenSM \
                             would merge this partition into it: expected a P_Key of its own, \
                             or an explicit one there",
                            self.label(i),
                            self.line(generated_at)
                        ),
                    )),
                },
            };
        }
        match self.by_name.get(name) {
            Some(&Named::One(i)) => {
                let key = self.parts[i].key;
                self.note(
                    at,
                    format!(
                        "`{name}` has no P_Key: OpenSM adds it to the earlier `{name}` \
                         (0x{key:04x}) by name"
                    ),
                );
                Ok(i)
            }
            Some(Named::Several) => Err(self.err(
                at,
                format!(
                    "`{name}` has no P_Key and several partitions have that name: expected a P_Key"
                ),
            )),
            None => {
                let key = self.generate(at)?;
                Ok(self.create(name, key, Some(at)))
            }
        }
    }

    fn create(&mut self, name: &'a str, key: u16, generated_at: Option<usize>) -> usize {
        let i = self.parts.len();
        self.parts.push(Partition {
            name,
            key,
            generated_at,
            member: None,
            groups: Vec::new(),
        });
        self.by_key.insert(key, i);
        if !name.is_empty() {
            self.by_name
                .entry(name)
                .and_modify(|n| *n = Named::Several)
                .or_insert(Named::One(i));
        }
        i
    }

    /// OpenSM's `generate_pkey`: the next value after the last generated one
    /// that no partition defined so far uses.
    fn generate(&mut self, at: usize) -> Result<u16, PartitionsError> {
        while self.last_generated < LAST_GENERATED {
            self.last_generated += 1;
            if !self.by_key.contains_key(&self.last_generated) {
                return Ok(self.last_generated);
            }
        }
        Err(self.err(
            at,
            "no P_Key left to generate (OpenSM generates 0x0001 to 0x7ffe): expected an explicit P_Key",
        ))
    }

    /// The member list up to `;`: entries separated by `,` or new lines.
    /// Returns how this definition names this port, if it does.
    fn members(
        &mut self,
        part: usize,
        flags: &Flags,
        start: usize,
    ) -> Result<Option<Membership>, PartitionsError> {
        let mut mention = None;
        loop {
            self.skip_space();
            match self.peek() {
                Some(b';') => {
                    self.pos += 1;
                    return Ok(mention);
                }
                None => {
                    let what = format!(
                        "`;` to end the definition of {} begun on line {}",
                        self.label(part),
                        self.line(start)
                    );
                    return Err(self.expected(&what));
                }
                Some(_) => mention = mention.max(self.member(part, flags)?),
            }
            self.skip_blanks();
            if !self.eat(b',') && !self.at_entry_end() {
                return Err(self.expected("`,`, `;` or a new line after the member"));
            }
        }
    }

    /// One member: `mgid=...`, or a keyword or GUID with an optional
    /// `=membership`. Returns the membership it gives this port, if any.
    fn member(
        &mut self,
        part: usize,
        flags: &Flags,
    ) -> Result<Option<Membership>, PartitionsError> {
        let (word, at) = self.take(is_word_byte);
        if word == "mgid" {
            self.mgroup(part, flags.group)?;
            return Ok(None);
        }
        let who = self.who(word, at)?;
        let explicit = self.member_membership()?;
        if who == Who::Nobody {
            return match explicit {
                Some((_, at)) => Err(self.err(at, "`NONE` takes no membership")),
                None => Ok(None),
            };
        }
        if !self.includes(who) {
            return Ok(None);
        }
        let m = explicit.map_or(flags.defmember, |(m, _)| m);
        if m == Membership::Both {
            self.note(
                at,
                "`both` gives this port two entries only when opensm.conf sets allow_both_pkeys \
                 TRUE; otherwise OpenSM programs the full one alone",
            );
        }
        Ok(Some(m))
    }

    fn who(&mut self, word: &str, at: usize) -> Result<Who, PartitionsError> {
        if word.is_empty() {
            return Err(self.expected(&format!("a member: {MEMBER_WORDS}")));
        }
        if word.starts_with(|c: char| c.is_ascii_digit()) {
            return match self.number(word, at, "a port GUID")? {
                0 => Err(self.err(at, "port GUID 0: expected a nonzero 64-bit GUID")),
                guid => Ok(Who::Guid(guid)),
            };
        }
        let Some((name, who)) = abbreviates(word, &KEYWORDS) else {
            return Err(self.err(
                at,
                format!("unknown member `{word}`: expected {MEMBER_WORDS}"),
            ));
        };
        self.spelled(word, name, at);
        Ok(who)
    }

    /// `=full|limited|both` after a member, on its line.
    fn member_membership(&mut self) -> Result<Option<At<Membership>>, PartitionsError> {
        self.skip_blanks();
        if !self.eat(b'=') {
            return Ok(None);
        }
        let (word, at) = self.value("full, limited or both")?;
        Ok(Some((self.membership(word, at)?, at)))
    }

    /// Whether a member entry names this CA port.
    fn includes(&self, who: Who) -> bool {
        match who {
            Who::All | Who::Cas => true,
            Who::Nobody | Who::Switches | Who::Routers => false,
            Who::Sm => self.opts.is_sm,
            Who::Guid(guid) => guid == self.opts.port_guid,
        }
    }

    /// `mgid=GID[,flag=value]*` to the end of the line, as OpenSM reads it:
    /// it takes anything after the GID on that line for group flags.
    fn mgroup(&mut self, part: usize, inherited: GroupFlags) -> Result<(), PartitionsError> {
        self.skip_blanks();
        if !self.eat(b'=') {
            return Err(self.expected("`=` and a multicast GID after `mgid`"));
        }
        self.skip_blanks();
        let (text, at) = self.take(is_gid_byte);
        let mgid = self.mgid(text, at)?;
        let mut flags = inherited;
        let mut seen = Vec::new();
        loop {
            self.skip_blanks();
            if !self.eat(b',') {
                break;
            }
            let expected = "a multicast group flag: mtu, rate, sl, scope, Q_Key, TClass or \
                            FlowLabel (an mgid entry takes the rest of its line)";
            let (name, flag, _) = self.flag_name(group_flag_named, &mut seen, expected)?;
            let value = self.flag_value(name)?;
            self.group_flag(&mut flags, flag, self.need(value, name)?)?;
        }
        if !self.at_entry_end() {
            return Err(self.expected(
                "`,` and a group flag, or the end of the line (an mgid entry takes the rest of its line)",
            ));
        }
        self.add_mgroup(part, mgid, flags, inherited, at)
    }

    fn mgid(&self, text: &str, at: usize) -> Result<Ipv6Addr, PartitionsError> {
        if text.is_empty() {
            return Err(self.expected("a multicast GID"));
        }
        let mgid: Ipv6Addr = text.parse().map_err(|_| {
            self.err(
                at,
                format!("expected an IPv6 multicast GID, found `{text}`"),
            )
        })?;
        if !mgid.is_multicast() {
            return Err(self.err(
                at,
                format!("GID {text} is not multicast: expected one in ff00::/8"),
            ));
        }
        Ok(mgid)
    }

    /// The groups OpenSM creates for an `mgid=` entry (`mgroup_create`): IP
    /// groups get the partition's P_Key bits and the IPoIB Q_Key by default.
    fn add_mgroup(
        &mut self,
        part: usize,
        mgid: Ipv6Addr,
        flags: GroupFlags,
        inherited: GroupFlags,
        at: usize,
    ) -> Result<(), PartitionsError> {
        let mut octets = mgid.octets();
        let mut qkey = flags.qkey;
        if is_ip_group(&octets) {
            self.check_ip_group(part, mgid, flags, inherited, at)?;
            octets[4..6].copy_from_slice(&(self.parts[part].key | FULL).to_be_bytes());
            if qkey == 0 {
                qkey = IPOIB_QKEY;
            }
        }
        let scope = octets[1] & 0x0f;
        if flags.scopes == 0 && scope != DEFAULT_SCOPE {
            self.note(
                at,
                format!(
                    "OpenSM gives {mgid} scope {DEFAULT_SCOPE} (link-local), not {scope}: \
                     add scope={scope} to keep it"
                ),
            );
        }
        self.add_groups(part, octets, flags.scopes, qkey, at)
    }

    /// OpenSM skips an IP group, logging an error, unless its P_Key bits
    /// are 0 or the partition's, and its rate and MTU the partition's.
    fn check_ip_group(
        &self,
        part: usize,
        mgid: Ipv6Addr,
        flags: GroupFlags,
        inherited: GroupFlags,
        at: usize,
    ) -> Result<(), PartitionsError> {
        let pkey = self.parts[part].key | FULL;
        let octets = mgid.octets();
        let bits = u16::from_be_bytes([octets[4], octets[5]]);
        if mgid != IPOIB_BROADCAST && bits != 0 && bits != pkey {
            return Err(self.err(
                at,
                format!(
                    "IP multicast GID {mgid} carries P_Key 0x{bits:04x}: expected 0x0000 (filled \
                     in) or 0x{pkey:04x}, its partition's"
                ),
            ));
        }
        for (what, got, want) in [
            ("rate", flags.rate, inherited.rate),
            ("mtu", flags.mtu, inherited.mtu),
        ] {
            if got != want {
                return Err(self.err(
                    at,
                    format!(
                        "IP multicast group {mgid} has {what} {got}: expected {want}, the \
                         partition's broadcast group {what}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The IPoIB broadcast group `ff12:401b:<P_Key>::ffff:ffff` an `ipoib`
    /// partition gets (`partition_create`).
    fn broadcast_group(
        &mut self,
        part: usize,
        flags: GroupFlags,
        at: usize,
    ) -> Result<(), PartitionsError> {
        let mut octets = IPOIB_BROADCAST.octets();
        octets[4..6].copy_from_slice(&(self.parts[part].key | FULL).to_be_bytes());
        let qkey = if flags.qkey == 0 {
            IPOIB_QKEY
        } else {
            flags.qkey
        };
        self.add_groups(part, octets, flags.scopes, qkey, at)
    }

    /// One group per scope asked for, link-local if none: OpenSM overwrites
    /// the scope nibble (`osm_prtn_add_mcgroup`).
    fn add_groups(
        &mut self,
        part: usize,
        octets: [u8; 16],
        scopes: u16,
        qkey: u32,
        at: usize,
    ) -> Result<(), PartitionsError> {
        let scopes = if scopes == 0 {
            1 << DEFAULT_SCOPE
        } else {
            scopes
        };
        for scope in (1..16u8).filter(|s| scopes & (1 << s) != 0) {
            let mut scoped = octets;
            scoped[1] = (scoped[1] & 0xf0) | scope;
            self.add_group(part, Ipv6Addr::from(scoped), qkey, at)?;
        }
        Ok(())
    }

    /// Repeats within a partition are one group; OpenSM would silently keep
    /// the first of conflicting ones.
    fn add_group(
        &mut self,
        part: usize,
        mgid: Ipv6Addr,
        qkey: u32,
        at: usize,
    ) -> Result<(), PartitionsError> {
        if let Some(&i) = self.by_mgid.get(&mgid) {
            let first = &self.groups[i];
            if first.part == part && first.qkey == qkey {
                return Ok(());
            }
            return Err(self.err(
                at,
                format!(
                    "multicast group {mgid} is already defined on line {} for {} with Q_Key \
                     0x{:x}: expected each group once (OpenSM keeps the first)",
                    self.line(first.at),
                    self.label(first.part),
                    first.qkey
                ),
            ));
        }
        self.by_mgid.insert(mgid, self.groups.len());
        self.parts[part].groups.push(self.groups.len());
        self.groups.push(Group {
            mgid,
            qkey,
            part,
            at,
        });
        Ok(())
    }

    /// Ends a definition: merges this port's mention into the partition and
    /// places `indx0`. OpenSM keeps the last `indx0` a port gets, and drops
    /// it when a later definition of its partition names the port without
    /// one; both are refused here rather than guessed.
    fn close(
        &mut self,
        part: usize,
        mention: Option<Membership>,
        flags: &Flags,
        start: usize,
    ) -> Result<(), PartitionsError> {
        if part == DEFAULT_PART {
            self.default_rule.get_or_insert(start);
            self.default_named |= mention.is_some();
        }
        if mention.is_none() {
            return Ok(());
        }
        self.parts[part].member = self.parts[part].member.max(mention);
        match (flags.indx0_at, self.indx0) {
            (Some(at), Some((other, other_at))) if other != part => Err(self.err(
                at,
                format!(
                    "indx0 for this port again: {} already puts its entry at index 0 (line {}); \
                     expected one partition with indx0 per port",
                    self.label(other),
                    self.line(other_at)
                ),
            )),
            (Some(at), None) => {
                self.indx0 = Some((part, at));
                Ok(())
            }
            (None, Some((other, other_at))) if other == part => Err(self.err(
                start,
                format!(
                    "this definition names this port without indx0, so OpenSM forgets the indx0 \
                     of line {}: expected indx0 here too",
                    self.line(other_at)
                ),
            )),
            _ => Ok(()),
        }
    }

    fn finish(mut self) -> Derived {
        if let (Some(at), false) = (self.default_rule, self.default_named) {
            self.note(
                at,
                "no rule for the default partition names this port, yet OpenSM keeps it a member: \
                 it adds `ALL=limited, SELF=full` before reading the file",
            );
        }
        let first = self.indx0.map(|(part, _)| part);
        let order = first
            .into_iter()
            .chain((0..self.parts.len()).filter(|&i| Some(i) != first));
        let (mut pkeys, mut names, mut groups) = (Vec::new(), Vec::new(), Vec::new());
        for part in order.map(|i| &self.parts[i]) {
            let Some(m) = part.member else { continue };
            for pkey in entries(part.key, m) {
                pkeys.push(pkey);
                names.push(part.name.to_string());
            }
            let pkey = entries(part.key, m).next().unwrap_or(part.key);
            groups.extend(part.groups.iter().map(|&g| DerivedGroup {
                mgid: self.groups[g].mgid,
                pkey,
                qkey: self.groups[g].qkey,
            }));
        }
        let notes = std::mem::take(&mut self.notes);
        let warnings = self.located(notes);
        Derived {
            pkeys,
            names,
            groups,
            warnings,
        }
    }

    /// `FILE:LINE:COL: message` for each note, in file order, in one sweep.
    fn located(&self, mut notes: Vec<(usize, String)>) -> Vec<String> {
        notes.sort_by_key(|&(at, _)| at);
        let (mut from, mut line, mut column) = (0, 1, 1);
        notes
            .into_iter()
            .map(|(at, message)| {
                let (lines, col) = position(&self.text[from..], at - from);
                (line, column) = if lines == 1 {
                    (line, column + col - 1)
                } else {
                    (line + lines - 1, col)
                };
                from = at;
                format!("{}:{line}:{column}: {message}", self.path.display())
            })
            .collect()
    }

    /// A P_Key as written for a partition: at most 16 bits, the membership
    /// bit ignored, the key portion nonzero.
    fn pkey(&self, word: &str, at: usize) -> Result<u16, PartitionsError> {
        let value = self.number(word, at, "a P_Key")?;
        let Ok(pkey) = u16::try_from(value) else {
            return Err(self.err(
                at,
                format!(
                    "P_Key {word} does not fit in 16 bits: expected at most 0xffff (OpenSM would \
                     take 0x{:04x})",
                    value as u16
                ),
            ));
        };
        match pkey & KEY_MASK {
            0 => Err(self.err(
                at,
                format!(
                    "P_Key {word} has key portion 0, the invalid P_Key: expected 0x0001 to 0x7fff"
                ),
            )),
            key => Ok(key),
        }
    }

    /// `0x` hexadecimal or decimal. A decimal with a leading zero is refused:
    /// OpenSM's `strtoul(s, &end, 0)` reads it as octal.
    fn number(&self, word: &str, at: usize, what: &str) -> Result<u64, PartitionsError> {
        let (digits, radix) = match word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None => (word, 10),
        };
        let valid = |c: u8| {
            if radix == 16 {
                c.is_ascii_hexdigit()
            } else {
                c.is_ascii_digit()
            }
        };
        if digits.is_empty() || !digits.bytes().all(valid) {
            return Err(self.err(
                at,
                format!("expected {what} (hexadecimal with 0x, or decimal), found `{word}`"),
            ));
        }
        if radix == 10 && digits.len() > 1 && digits.starts_with('0') {
            return Err(self.err(
                at,
                format!(
                    "`{word}` has a leading zero, which OpenSM reads as octal: expected {what} in \
                     hexadecimal with 0x, or decimal without the zero"
                ),
            ));
        }
        u64::from_str_radix(digits, radix).map_err(|_| {
            self.err(
                at,
                format!("`{word}` does not fit in 64 bits: expected {what}"),
            )
        })
    }

    /// Warns about a word OpenSM takes for `name` by abbreviation, or by the
    /// UFM manual's spelling that upstream OpenSM does not know.
    fn spelled(&mut self, word: &str, name: &str, at: usize) {
        if word == name {
            return;
        }
        let message = if name.starts_with(word) {
            format!("`{word}` taken as `{name}`, as OpenSM matches abbreviations: write it in full")
        } else {
            format!(
                "`{word}` taken as `{name}`; upstream OpenSM knows only `{name}` and ignores `{word}`"
            )
        };
        self.note(at, message);
    }

    fn note(&mut self, at: usize, message: impl Into<String>) {
        self.notes.push((at, message.into()));
    }

    fn label(&self, part: usize) -> String {
        let Partition { name, key, .. } = self.parts[part];
        match name {
            "" => format!("partition 0x{key:04x}"),
            _ => format!("partition `{name}` (0x{key:04x})"),
        }
    }

    fn line(&self, at: usize) -> usize {
        position(self.text, at).0
    }

    fn err(&self, at: usize, message: impl Into<String>) -> PartitionsError {
        let (line, column) = position(self.text, at);
        PartitionsError {
            file: self.path.display().to_string(),
            line,
            column,
            message: message.into(),
        }
    }

    fn expected(&self, what: &str) -> PartitionsError {
        self.err(self.pos, format!("expected {what}, found {}", self.found()))
    }

    /// What is at `pos`, for error messages.
    fn found(&self) -> String {
        let rest = &self.text[self.pos..];
        let word = &rest[..rest.bytes().take_while(|&c| is_word_byte(c)).count()];
        match rest.chars().next() {
            None => "the end of the file".into(),
            Some('\n') => "the end of the line".into(),
            Some('#') => "a comment".into(),
            Some('\r') => {
                "a carriage return, which OpenSM does not take for white space (use LF line ends)"
                    .into()
            }
            Some(c) if c.is_control() => format!("control character {c:?}"),
            Some(_) if !word.is_empty() => format!("`{word}`"),
            Some(c) => format!("`{c}`"),
        }
    }

    /// A value after `=`: blanks, then a word.
    fn value(&mut self, what: &str) -> Result<At<&'a str>, PartitionsError> {
        self.skip_blanks();
        match self.take(is_word_byte) {
            ("", _) => Err(self.expected(what)),
            value => Ok(value),
        }
    }

    /// Whether another definition follows, past white space and comments.
    fn more(&mut self) -> bool {
        self.skip_space();
        self.pos < self.text.len()
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.pos += usize::from(hit);
        hit
    }

    /// Where a member entry may end: a new line, a comment, `;` or the end.
    fn at_entry_end(&self) -> bool {
        matches!(self.peek(), None | Some(b'\n' | b'#' | b';'))
    }

    /// The longest run of bytes `keep` accepts; `keep` must stop at ASCII
    /// bytes only, so the run ends on a character boundary.
    fn take(&mut self, keep: fn(u8) -> bool) -> At<&'a str> {
        let start = self.pos;
        let len = self.text.as_bytes()[start..]
            .iter()
            .take_while(|&&c| keep(c))
            .count();
        self.pos += len;
        (&self.text[start..self.pos], start)
    }

    /// Spaces and tabs: what may separate tokens within a line.
    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
    }

    /// Blanks, new lines and comments.
    fn skip_space(&mut self) {
        loop {
            match self.peek() {
                Some(b' ' | b'\t' | b'\n') => self.pos += 1,
                Some(b'#') => {
                    let rest = &self.text[self.pos..];
                    self.pos += rest.find('\n').unwrap_or(rest.len());
                }
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests;
