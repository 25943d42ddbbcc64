//! Element types.

use std::fmt;
use std::str::FromStr;

/// An element type, numbered as NCCL's `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    I8 = 0,
    U8 = 1,
    I32 = 2,
    U32 = 3,
    I64 = 4,
    U64 = 5,
    F16 = 6,
    F32 = 7,
    F64 = 8,
    Bf16 = 9,
    F8E4M3 = 10,
    F8E5M2 = 11,
}

impl DataType {
    /// Every type, in numeric order (index `i` holds the type numbered `i`).
    pub const ALL: [DataType; 12] = [
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
        DataType::F16,
        DataType::F32,
        DataType::F64,
        DataType::Bf16,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Bytes per element (a power of two).
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::I32 | DataType::U32 | DataType::F32 => 4,
            DataType::I64 | DataType::U64 | DataType::F64 => 8,
        }
    }

    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F16 | DataType::F32 | DataType::F64 | DataType::Bf16 | DataType::F8E4M3 | DataType::F8E5M2
        )
    }

    /// The two 8-bit float formats.
    pub const fn is_fp8(self) -> bool {
        matches!(self, DataType::F8E4M3 | DataType::F8E5M2)
    }

    /// NCCL's `ncclDataType_t` name, as profiler plugins receive it.
    pub const fn nccl_name(self) -> &'static str {
        match self {
            DataType::I8 => "ncclInt8",
            DataType::U8 => "ncclUint8",
            DataType::I32 => "ncclInt32",
            DataType::U32 => "ncclUint32",
            DataType::I64 => "ncclInt64",
            DataType::U64 => "ncclUint64",
            DataType::F16 => "ncclFloat16",
            DataType::F32 => "ncclFloat32",
            DataType::F64 => "ncclFloat64",
            DataType::Bf16 => "ncclBfloat16",
            DataType::F8E4M3 => "ncclFloat8e4m3",
            DataType::F8E5M2 => "ncclFloat8e5m2",
        }
    }

    /// The name nccl-tests prints in its `type` column (and `Display` prints).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::F16 => "half",
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::Bf16 => "bfloat16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// The Rust-style name (`i32`, `f16`, `bf16`, `f8e4m3`): the suffix of the kernels' names.
    pub const fn short_name(self) -> &'static str {
        match self {
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
            DataType::F16 => "f16",
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::Bf16 => "bf16",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// The type numbered `v` in `ncclDataType_t`.
    pub fn from_u8(v: u8) -> Option<DataType> {
        DataType::ALL.get(usize::from(v)).copied()
    }

    /// The type NCCL names `name` (`ncclFloat32`, as [`DataType::nccl_name`] writes it).
    pub fn from_nccl_name(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|d| d.nccl_name() == name)
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = String;

    /// Accepts nccl-tests' names (`float`, `half`, `bfloat16`, `int32`…) and Rust-style ones
    /// (`f32`, `f16`, `bf16`, `i32`…).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "int8" | "i8" | "char" => DataType::I8,
            "uint8" | "u8" => DataType::U8,
            "int32" | "i32" | "int" => DataType::I32,
            "uint32" | "u32" => DataType::U32,
            "int64" | "i64" => DataType::I64,
            "uint64" | "u64" => DataType::U64,
            "half" | "f16" | "float16" => DataType::F16,
            "float" | "f32" | "float32" => DataType::F32,
            "double" | "f64" | "float64" => DataType::F64,
            "bfloat16" | "bf16" => DataType::Bf16,
            "f8e4m3" | "fp8_e4m3" | "e4m3" => DataType::F8E4M3,
            "f8e5m2" | "fp8_e5m2" | "e5m2" => DataType::F8E5M2,
            _ => {
                return Err(format!(
                    "unknown datatype '{s}'; expected one of int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2"
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::DataType;

    #[test]
    fn numbers_are_nccl_datatype_t_and_every_name_parses_back() {
        for (i, dt) in DataType::ALL.iter().enumerate() {
            assert_eq!(*dt as usize, i);
            assert_eq!(DataType::from_u8(i as u8), Some(*dt));
            assert_eq!(dt.name().parse::<DataType>(), Ok(*dt));
            assert_eq!(dt.short_name().parse::<DataType>(), Ok(*dt));
            assert_eq!(DataType::from_nccl_name(dt.nccl_name()), Some(*dt));
            assert!(dt.size().is_power_of_two());
            assert!(!dt.is_fp8() || (dt.is_float() && dt.size() == 1));
        }
        assert_eq!(DataType::from_u8(12), None);
        assert_eq!(DataType::Bf16.nccl_name(), "ncclBfloat16");
        assert!("f128".parse::<DataType>().is_err());
        assert_eq!(DataType::from_nccl_name("float"), None);
    }
}
