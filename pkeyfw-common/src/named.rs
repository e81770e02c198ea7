//! Enums whose variants are part of the kernel/user ABI and have names in
//! the CLI, the JSON output and the policy file, declared once: one line per
//! variant gives its value and its name, and [`named_enum!`] writes the rest
//! (`ALL`, `COUNT`, `name`, `from_name`, `from_repr`).
//!
//! A `counter` enum indexes a counter map: its values must be `0..COUNT` in
//! declaration order, which a compile-time check enforces, so a new variant
//! can never be left without a counter slot.

/// Declares a `#[repr]` enum with a name per variant; see the module doc.
///
/// ```ignore
/// named_enum! {
///     /// Doc.
///     pub enum Colour: u8 {
///         /// Doc.
///         Red = 0 => "red",
///         Blue = 3 => "blue",
///     }
/// }
/// ```
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident : $repr:ident $(as $counter:ident)? {
            $( $(#[$vmeta:meta])* $variant:ident = $value:literal => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[repr($repr)]
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($name::$variant),+].len()] = [$($name::$variant),+];
            /// Number of variants.
            pub const COUNT: usize = Self::ALL.len();

            /// The name used by the CLI, the JSON output and the policy file.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }

            /// The variant with this [`name`](Self::name).
            pub fn from_name(name: &str) -> Option<$name> {
                Self::ALL.into_iter().find(|v| v.name() == name)
            }

            /// The variant with this value, as stored in a map.
            #[inline(always)]
            pub const fn from_repr(value: $repr) -> Option<$name> {
                match value {
                    $( $value => Some($name::$variant), )+
                    _ => None,
                }
            }
        }

        $( $crate::named_enum!(@$counter $name); )?
    };
    (@counter $name:ident) => {
        impl $name {
            /// Index of this variant's counter.
            #[inline(always)]
            pub const fn index(self) -> u32 {
                self as u32
            }
        }

        // Counter slots are the values: they must be 0..COUNT, in order.
        const _: () = {
            let mut i = 0;
            while i < $name::COUNT {
                assert!($name::ALL[i] as usize == i, "counter values must be 0..COUNT in order");
                i += 1;
            }
        };
    };
}

#[cfg(test)]
mod tests {
    named_enum! {
        /// A test enum with gaps.
        enum Sparse: u8 {
            A = 0 => "a",
            B = 3 => "b",
        }
    }

    named_enum! {
        enum Dense: u32 as counter {
            X = 0 => "x",
            Y = 1 => "y",
            Z = 2 => "z",
        }
    }

    #[test]
    fn generated_items_agree() {
        assert_eq!(Sparse::COUNT, 2);
        assert_eq!(Sparse::from_name("b"), Some(Sparse::B));
        assert_eq!(Sparse::from_repr(3), Some(Sparse::B));
        assert_eq!(Sparse::from_repr(1), None);
        assert_eq!(Dense::ALL.map(Dense::index), [0, 1, 2]);
        assert_eq!(Dense::from_name("w"), None);
        assert_eq!(Dense::from_repr(2), Some(Dense::Z));
    }
}
