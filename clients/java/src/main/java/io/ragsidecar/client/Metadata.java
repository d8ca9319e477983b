package io.ragsidecar.client;

import com.google.protobuf.Timestamp;
import io.ragsidecar.v1.MetadataValue;
import io.ragsidecar.v1.StringList;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZonedDateTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;

/**
 * Typed MEMORY metadata between Java values and {@link MetadataValue}: a {@link CharSequence} is a string, a
 * {@link Number} a (finite) number, a {@link Boolean} a boolean, an {@link Instant} (or {@link OffsetDateTime},
 * {@link ZonedDateTime}, {@link Date}) a timestamp, and a collection or array of strings a string list. Read back,
 * values are {@code String}, {@code Double}, {@code Boolean}, {@code Instant} and an unmodifiable {@code List<String>}.
 *
 * <pre>{@code
 * MemoryDocument note = MemoryDocument.newBuilder().setId("n1").setText("Bob prefers Saturday delivery.")
 *     .putAllTypedMetadata(Metadata.values(Map.of("priority", 2, "tags", List.of("delivery"))))
 *     .setExpiresAt(Metadata.timestamp(Instant.now().plus(Duration.ofDays(30))))
 *     .build();
 * }</pre>
 */
public final class Metadata {
  private Metadata() {}

  /** The metadata value of a Java value (see the class comment); anything else is an IllegalArgumentException. */
  public static MetadataValue value(Object value) {
    Objects.requireNonNull(value, "metadata value");
    if (value instanceof MetadataValue v) {
      return v;
    }
    if (value instanceof CharSequence s) {
      return MetadataValue.newBuilder().setStringValue(s.toString()).build();
    }
    if (value instanceof Boolean b) {
      return MetadataValue.newBuilder().setBoolValue(b).build();
    }
    if (value instanceof Number n) {
      double d = n.doubleValue();
      if (!Double.isFinite(d)) {
        throw new IllegalArgumentException("a metadata number must be finite: " + value);
      }
      return MetadataValue.newBuilder().setNumberValue(d).build();
    }
    Instant instant = instant(value);
    if (instant != null) {
      return MetadataValue.newBuilder().setTimestampValue(timestamp(instant)).build();
    }
    if (value instanceof Object[] items) {
      return value(Arrays.asList(items));
    }
    if (value instanceof Collection<?> items) {
      StringList.Builder list = StringList.newBuilder();
      for (Object item : items) {
        if (!(item instanceof CharSequence s)) {
          throw new IllegalArgumentException("a metadata list holds strings only, not " + describe(item));
        }
        list.addValues(s.toString());
      }
      return MetadataValue.newBuilder().setStringListValue(list).build();
    }
    throw new IllegalArgumentException("not a metadata value (string, number, boolean, instant or list of strings): "
        + describe(value));
  }

  /** {@link #value(Object)} of each entry, in the map's order. */
  public static Map<String, MetadataValue> values(Map<String, ?> values) {
    Map<String, MetadataValue> out = new LinkedHashMap<>();
    values.forEach((key, v) -> {
      try {
        out.put(Objects.requireNonNull(key, "metadata key"), value(v));
      } catch (IllegalArgumentException | NullPointerException e) {
        throw new IllegalArgumentException("metadata \"" + key + "\": " + e.getMessage(), e);
      }
    });
    return out;
  }

  /** The Java value of a metadata value: String, Double, Boolean, Instant or an unmodifiable List of String. */
  public static Object toJava(MetadataValue value) {
    return switch (value.getKindCase()) {
      case STRING_VALUE -> value.getStringValue();
      case NUMBER_VALUE -> value.getNumberValue();
      case BOOL_VALUE -> value.getBoolValue();
      case TIMESTAMP_VALUE -> instant(value.getTimestampValue());
      case STRING_LIST_VALUE -> List.copyOf(value.getStringListValue().getValuesList());
      case KIND_NOT_SET -> throw new IllegalArgumentException("a metadata value without a kind");
    };
  }

  /** {@link #toJava(MetadataValue)} of each entry; unmodifiable, in the map's order. */
  public static Map<String, Object> toJava(Map<String, MetadataValue> values) {
    Map<String, Object> out = new LinkedHashMap<>();
    values.forEach((key, v) -> out.put(key, toJava(v)));
    return Collections.unmodifiableMap(out);
  }

  /** The protobuf timestamp of an instant. */
  public static Timestamp timestamp(Instant instant) {
    return Timestamp.newBuilder().setSeconds(instant.getEpochSecond()).setNanos(instant.getNano()).build();
  }

  /** The instant of a protobuf timestamp. */
  public static Instant instant(Timestamp timestamp) {
    return Instant.ofEpochSecond(timestamp.getSeconds(), timestamp.getNanos());
  }

  private static Instant instant(Object value) {
    if (value instanceof Instant i) {
      return i;
    }
    if (value instanceof OffsetDateTime t) {
      return t.toInstant();
    }
    if (value instanceof ZonedDateTime t) {
      return t.toInstant();
    }
    if (value instanceof Date d) {
      return d.toInstant();
    }
    return null;
  }

  private static String describe(Object value) {
    return value == null ? "null" : value.getClass().getName();
  }

  static List<MetadataValue> valueList(Collection<?> values) {
    List<MetadataValue> out = new ArrayList<>(values.size());
    values.forEach(v -> out.add(value(v)));
    return out;
  }
}
