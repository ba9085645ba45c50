//! Serde helpers shared by both formats.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{I64Deserializer, StrDeserializer, U64Deserializer};
use serde::de::{self, Deserialize, Deserializer, IntoDeserializer, SeqAccess, Visitor};

/// Deserializes a field that NVIDIA's formats accept as one value or a list of values (`device-filter`,
/// `deviceListStrategy`) into a list. A null value reads as an empty list, like a missing field; an explicit
/// empty list is an error, because it would silently mean "no filter" or "no strategy".
///
/// List elements are deserialized one by one, so an error in one names its index in the path.
pub(crate) fn one_or_many<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    deserializer.deserialize_any(OneOrMany(PhantomData))
}

/// The visitor of [`one_or_many`].
struct OneOrMany<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrMany<T> {
    type Value = Vec<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("a value or a list of values")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Self::Value, E> {
        let single: StrDeserializer<'_, E> = value.into_deserializer();
        Ok(vec![T::deserialize(single)?])
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
        let single: U64Deserializer<E> = value.into_deserializer();
        Ok(vec![T::deserialize(single)?])
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<Self::Value, E> {
        let single: I64Deserializer<E> = value.into_deserializer();
        Ok(vec![T::deserialize(single)?])
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut values = Vec::new();
        while let Some(value) = seq.next_element()? {
            values.push(value);
        }
        if values.is_empty() {
            return Err(de::Error::custom(
                "the list is empty: give at least one value, or remove the field",
            ));
        }
        Ok(values)
    }
}
