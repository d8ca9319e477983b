package io.ragsidecar.client;

import io.ragsidecar.v1.Comparison;
import io.ragsidecar.v1.ComparisonOperator;
import io.ragsidecar.v1.Exists;
import io.ragsidecar.v1.Filter;
import io.ragsidecar.v1.FilterList;
import io.ragsidecar.v1.Membership;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.Objects;

/**
 * Builders of the sidecar's {@link Filter}: a boolean expression over a document's metadata and reserved fields,
 * used by Search (per knowledge entry), {@link SidecarRetrieval#listDocuments ListDocuments} and
 * {@link SidecarRetrieval#deleteDocuments(String, Filter) delete by filter}. Values convert as {@link Metadata#value}
 * does. docs/memory.md gives the language: a document lacking a field matches no comparison but {@code ne}, and no
 * membership but {@code notIn}; a string-list field equals each string it holds.
 *
 * <pre>{@code
 * Filter recentHigh = Filters.and(Filters.gte("priority", 2), Filters.in("tags", List.of("delivery", "billing")),
 *     Filters.gt(Filters.CREATED, Instant.parse("2026-01-01T00:00:00Z")));
 * }</pre>
 */
public final class Filters {
  /** Reserved field: the document's id (a string). */
  public static final String ID = "$id";
  /** Reserved field: when the document was first written (a timestamp). */
  public static final String CREATED = "$created";
  /** Reserved field: when the document last changed (a timestamp). */
  public static final String UPDATED = "$updated";
  /** Reserved field: when the document expires (a timestamp; absent when it never does). */
  public static final String EXPIRES_AT = "$expires_at";
  /** Reserved field of FILE and DIRECTORY chunks: the file's path relative to its knowledge root. */
  public static final String PATH = "$path";
  /** Reserved field of FILE and DIRECTORY chunks: the file's name. */
  public static final String FILE_NAME = "$file_name";

  private Filters() {}

  /** field == value. */
  public static Filter eq(String field, Object value) {
    return compare(field, ComparisonOperator.COMPARISON_OPERATOR_EQUAL, value);
  }

  /** field != value (also true when the field is absent). */
  public static Filter ne(String field, Object value) {
    return compare(field, ComparisonOperator.COMPARISON_OPERATOR_NOT_EQUAL, value);
  }

  /** field &lt; value (strings, numbers, timestamps). */
  public static Filter lt(String field, Object value) {
    return compare(field, ComparisonOperator.COMPARISON_OPERATOR_LESS, value);
  }

  /** field &lt;= value. */
  public static Filter lte(String field, Object value) {
    return compare(field, ComparisonOperator.COMPARISON_OPERATOR_LESS_OR_EQUAL, value);
  }

  /** field &gt; value. */
  public static Filter gt(String field, Object value) {
    return compare(field, ComparisonOperator.COMPARISON_OPERATOR_GREATER, value);
  }

  /** field &gt;= value. */
  public static Filter gte(String field, Object value) {
    return compare(field, ComparisonOperator.COMPARISON_OPERATOR_GREATER_OR_EQUAL, value);
  }

  /** field in values (all of one kind; a string-list field is in them when it holds any). */
  public static Filter in(String field, Collection<?> values) {
    return membership(field, values, false);
  }

  /** field not in values (also true when the field is absent). */
  public static Filter notIn(String field, Collection<?> values) {
    return membership(field, values, true);
  }

  /** The document has the field. */
  public static Filter exists(String field) {
    return Filter.newBuilder().setExists(Exists.newBuilder().setField(Objects.requireNonNull(field, "field")))
        .build();
  }

  /** Every filter (an empty list keeps every document). */
  public static Filter and(Filter... filters) {
    return and(Arrays.asList(filters));
  }

  /** Every filter (an empty list keeps every document). */
  public static Filter and(Collection<Filter> filters) {
    return Filter.newBuilder().setAll(list(filters)).build();
  }

  /** At least one filter (an empty list keeps none). */
  public static Filter or(Filter... filters) {
    return or(Arrays.asList(filters));
  }

  /** At least one filter (an empty list keeps none). */
  public static Filter or(Collection<Filter> filters) {
    return Filter.newBuilder().setAny(list(filters)).build();
  }

  /** The negation of a filter. */
  public static Filter not(Filter filter) {
    return Filter.newBuilder().setNegation(Objects.requireNonNull(filter, "filter")).build();
  }

  /** A filter keeping every document (an empty {@code and}): with delete, it deletes them all. */
  public static Filter everything() {
    return and(List.of());
  }

  private static Filter compare(String field, ComparisonOperator operator, Object value) {
    return Filter.newBuilder().setComparison(Comparison.newBuilder().setField(Objects.requireNonNull(field, "field"))
        .setOperator(operator).setValue(Metadata.value(value))).build();
  }

  private static Filter membership(String field, Collection<?> values, boolean negated) {
    return Filter.newBuilder().setMembership(Membership.newBuilder().setField(Objects.requireNonNull(field, "field"))
        .addAllValues(Metadata.valueList(values)).setNegated(negated)).build();
  }

  private static FilterList list(Collection<Filter> filters) {
    filters.forEach(f -> Objects.requireNonNull(f, "filter"));
    return FilterList.newBuilder().addAllFilters(filters).build();
  }
}
