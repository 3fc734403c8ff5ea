//! Writes a session's aggregate value into the session record's own JSON object, in the
//! value's own field order: a struct's or map's fields become the record's fields, a
//! tuple's elements become fields too (a struct or map element contributes its fields,
//! any other element is named `_1`, `_2`, ... by position), `()` and `None` add nothing,
//! and anything else is one field `value`.
//!
//! Done by serde directly, never through an intermediate `serde_json::Map` (which sorts
//! its keys): a probe first finds the value's shape (it stops at the first call), then
//! the value is serialized once more with its fields forwarded to the record's map.

use serde::ser::{
    self, Impossible, Serialize, SerializeMap, SerializeStruct, SerializeTuple,
    SerializeTupleStruct, Serializer,
};
use std::fmt;

/// Writes the fields of `value` into `map` (see the module's documentation).
pub(crate) fn flatten_into<M: SerializeMap, T: Serialize + ?Sized>(
    map: &mut M,
    value: &T,
) -> Result<(), M::Error> {
    match shape(value) {
        Shape::Fields => value.serialize(Fields { map }),
        Shape::Tuple => value.serialize(Tuple { map }),
        Shape::Nothing => Ok(()),
        Shape::Other => map.serialize_entry("value", value),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// A struct or map: its fields.
    Fields,
    /// A tuple (or tuple struct): its elements.
    Tuple,
    /// `()`, `None`, a unit struct: nothing.
    Nothing,
    /// Anything else: one value.
    Other,
}

fn shape<T: Serialize + ?Sized>(value: &T) -> Shape {
    match value.serialize(Probe) {
        Ok(never) => match never {},
        Err(Found(shape)) => shape,
    }
}

/// The probe's answer, carried as its "error" so that it stops at the first call.
#[derive(Debug)]
struct Found(Shape);

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Found {}

impl ser::Error for Found {
    fn custom<M: fmt::Display>(_: M) -> Self {
        Found(Shape::Other)
    }
}

enum Never {}

struct Probe;

macro_rules! probe_other {
    ($($method:ident($($arg:ty),*);)*) => {$(
        fn $method(self, $(_: $arg),*) -> Result<Never, Found> {
            Err(Found(Shape::Other))
        }
    )*};
}

impl Serializer for Probe {
    type Ok = Never;
    type Error = Found;
    type SerializeSeq = Impossible<Never, Found>;
    type SerializeTuple = Impossible<Never, Found>;
    type SerializeTupleStruct = Impossible<Never, Found>;
    type SerializeTupleVariant = Impossible<Never, Found>;
    type SerializeMap = Impossible<Never, Found>;
    type SerializeStruct = Impossible<Never, Found>;
    type SerializeStructVariant = Impossible<Never, Found>;

    probe_other! {
        serialize_bool(bool);
        serialize_i8(i8);
        serialize_i16(i16);
        serialize_i32(i32);
        serialize_i64(i64);
        serialize_i128(i128);
        serialize_u8(u8);
        serialize_u16(u16);
        serialize_u32(u32);
        serialize_u64(u64);
        serialize_u128(u128);
        serialize_f32(f32);
        serialize_f64(f64);
        serialize_char(char);
        serialize_str(&str);
        serialize_bytes(&[u8]);
        serialize_unit_variant(&'static str, u32, &'static str);
    }

    fn serialize_none(self) -> Result<Never, Found> {
        Err(Found(Shape::Nothing))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Never, Found> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<Never, Found> {
        Err(Found(Shape::Nothing))
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Never, Found> {
        Err(Found(Shape::Nothing))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Never, Found> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &T,
    ) -> Result<Never, Found> {
        Err(Found(Shape::Other))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, Found> {
        Err(Found(Shape::Other))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, Found> {
        Err(Found(Shape::Tuple))
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, Found> {
        Err(Found(Shape::Tuple))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Found> {
        Err(Found(Shape::Other))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Found> {
        Err(Found(Shape::Fields))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Found> {
        Err(Found(Shape::Fields))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Found> {
        Err(Found(Shape::Other))
    }
}

/// The serializers below are only called on values of the shape the probe found; any
/// other call is a value that serializes differently the second time, an error.
fn unstable<E: ser::Error>() -> E {
    E::custom("an aggregate value serialized as two different shapes")
}

macro_rules! unexpected {
    ($($method:ident($($arg:ty),*);)*) => {$(
        fn $method(self, $(_: $arg),*) -> Result<(), M::Error> {
            Err(unstable())
        }
    )*};
}

macro_rules! unexpected_rest {
    () => {
        unexpected! {
            serialize_bool(bool);
            serialize_i8(i8);
            serialize_i16(i16);
            serialize_i32(i32);
            serialize_i64(i64);
            serialize_i128(i128);
            serialize_u8(u8);
            serialize_u16(u16);
            serialize_u32(u32);
            serialize_u64(u64);
            serialize_u128(u128);
            serialize_f32(f32);
            serialize_f64(f64);
            serialize_char(char);
            serialize_str(&str);
            serialize_bytes(&[u8]);
            serialize_none();
            serialize_unit();
            serialize_unit_struct(&'static str);
            serialize_unit_variant(&'static str, u32, &'static str);
        }
        fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), M::Error> {
            value.serialize(self)
        }
        fn serialize_newtype_struct<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            value: &T,
        ) -> Result<(), M::Error> {
            value.serialize(self)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: &T,
        ) -> Result<(), M::Error> {
            Err(unstable())
        }
        fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, M::Error> {
            Err(unstable())
        }
        fn serialize_tuple_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeTupleVariant, M::Error> {
            Err(unstable())
        }
        fn serialize_struct_variant(
            self,
            _: &'static str,
            _: u32,
            _: &'static str,
            _: usize,
        ) -> Result<Self::SerializeStructVariant, M::Error> {
            Err(unstable())
        }
    };
}

/// Forwards a struct's or map's fields to the record's map.
struct Fields<'m, M> {
    map: &'m mut M,
}

impl<'m, M: SerializeMap> Serializer for Fields<'m, M> {
    type Ok = ();
    type Error = M::Error;
    type SerializeSeq = Impossible<(), M::Error>;
    type SerializeTuple = Impossible<(), M::Error>;
    type SerializeTupleStruct = Impossible<(), M::Error>;
    type SerializeTupleVariant = Impossible<(), M::Error>;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Impossible<(), M::Error>;

    unexpected_rest!();

    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, M::Error> {
        Err(unstable())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleStruct, M::Error> {
        Err(unstable())
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self, M::Error> {
        Ok(self)
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self, M::Error> {
        Ok(self)
    }
}

impl<M: SerializeMap> SerializeStruct for Fields<'_, M> {
    type Ok = ();
    type Error = M::Error;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), M::Error> {
        self.map.serialize_entry(key, value)
    }
    fn end(self) -> Result<(), M::Error> {
        Ok(())
    }
}

impl<M: SerializeMap> SerializeMap for Fields<'_, M> {
    type Ok = ();
    type Error = M::Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), M::Error> {
        self.map.serialize_key(key)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), M::Error> {
        self.map.serialize_value(value)
    }
    fn end(self) -> Result<(), M::Error> {
        Ok(())
    }
}

/// Forwards a tuple's elements to the record's map.
struct Tuple<'m, M> {
    map: &'m mut M,
}

/// A tuple being written: the next element's position (from 1).
struct Elements<'m, M> {
    map: &'m mut M,
    next: usize,
}

impl<M: SerializeMap> Elements<'_, M> {
    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), M::Error> {
        let name = format!("_{}", self.next);
        self.next += 1;
        match shape(value) {
            Shape::Fields => value.serialize(Fields { map: self.map }),
            Shape::Nothing => Ok(()),
            Shape::Tuple | Shape::Other => self.map.serialize_entry(&name, value),
        }
    }
}

impl<'m, M: SerializeMap> Serializer for Tuple<'m, M> {
    type Ok = ();
    type Error = M::Error;
    type SerializeSeq = Impossible<(), M::Error>;
    type SerializeTuple = Elements<'m, M>;
    type SerializeTupleStruct = Elements<'m, M>;
    type SerializeTupleVariant = Impossible<(), M::Error>;
    type SerializeMap = Impossible<(), M::Error>;
    type SerializeStruct = Impossible<(), M::Error>;
    type SerializeStructVariant = Impossible<(), M::Error>;

    unexpected_rest!();

    fn serialize_tuple(self, _: usize) -> Result<Elements<'m, M>, M::Error> {
        Ok(Elements {
            map: self.map,
            next: 1,
        })
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Elements<'m, M>, M::Error> {
        Ok(Elements {
            map: self.map,
            next: 1,
        })
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, M::Error> {
        Err(unstable())
    }
    fn serialize_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStruct, M::Error> {
        Err(unstable())
    }
}

impl<M: SerializeMap> SerializeTuple for Elements<'_, M> {
    type Ok = ();
    type Error = M::Error;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), M::Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), M::Error> {
        Ok(())
    }
}

impl<M: SerializeMap> SerializeTupleStruct for Elements<'_, M> {
    type Ok = ();
    type Error = M::Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), M::Error> {
        self.element(value)
    }
    fn end(self) -> Result<(), M::Error> {
        Ok(())
    }
}
