package io.ragsidecar.langchain4j;

import dev.langchain4j.store.embedding.filter.Filter;
import dev.langchain4j.store.embedding.filter.comparison.IsEqualTo;
import dev.langchain4j.store.embedding.filter.comparison.IsGreaterThan;
import dev.langchain4j.store.embedding.filter.comparison.IsGreaterThanOrEqualTo;
import dev.langchain4j.store.embedding.filter.comparison.IsIn;
import dev.langchain4j.store.embedding.filter.comparison.IsLessThan;
import dev.langchain4j.store.embedding.filter.comparison.IsLessThanOrEqualTo;
import dev.langchain4j.store.embedding.filter.comparison.IsNotEqualTo;
import dev.langchain4j.store.embedding.filter.comparison.IsNotIn;
import dev.langchain4j.store.embedding.filter.logical.And;
import dev.langchain4j.store.embedding.filter.logical.Not;
import dev.langchain4j.store.embedding.filter.logical.Or;
import io.ragsidecar.client.Filters;
import java.util.Collection;
import java.util.List;
import java.util.UUID;

/**
 * LangChain4j's metadata {@link Filter} as the sidecar's filter: {@code IsEqualTo}, {@code IsNotEqualTo},
 * {@code IsGreaterThan}, {@code IsGreaterThanOrEqualTo}, {@code IsLessThan}, {@code IsLessThanOrEqualTo},
 * {@code IsIn}, {@code IsNotIn}, {@code And}, {@code Or}, {@code Not}; UUID values compare as their strings. Any other
 * filter ({@code ContainsString}, a host's own) is an {@link IllegalArgumentException} naming it.
 */
final class LangChain4jFilters {
  private LangChain4jFilters() {}

  static io.ragsidecar.v1.Filter translate(Filter filter) {
    if (filter instanceof IsEqualTo f) {
      return Filters.eq(f.key(), value(f.comparisonValue()));
    }
    if (filter instanceof IsNotEqualTo f) {
      return Filters.ne(f.key(), value(f.comparisonValue()));
    }
    if (filter instanceof IsGreaterThan f) {
      return Filters.gt(f.key(), value(f.comparisonValue()));
    }
    if (filter instanceof IsGreaterThanOrEqualTo f) {
      return Filters.gte(f.key(), value(f.comparisonValue()));
    }
    if (filter instanceof IsLessThan f) {
      return Filters.lt(f.key(), value(f.comparisonValue()));
    }
    if (filter instanceof IsLessThanOrEqualTo f) {
      return Filters.lte(f.key(), value(f.comparisonValue()));
    }
    if (filter instanceof IsIn f) {
      return Filters.in(f.key(), values(f.comparisonValues()));
    }
    if (filter instanceof IsNotIn f) {
      return Filters.notIn(f.key(), values(f.comparisonValues()));
    }
    if (filter instanceof And f) {
      return Filters.and(translate(f.left()), translate(f.right()));
    }
    if (filter instanceof Or f) {
      return Filters.or(translate(f.left()), translate(f.right()));
    }
    if (filter instanceof Not f) {
      return Filters.not(translate(f.expression()));
    }
    throw new IllegalArgumentException("cannot translate the LangChain4j filter to the sidecar's: "
        + (filter == null ? "null" : filter.getClass().getSimpleName() + " " + filter) + " has no counterpart");
  }

  private static Object value(Object value) {
    return value instanceof UUID uuid ? uuid.toString() : value;
  }

  private static List<Object> values(Collection<?> values) {
    return values.stream().map(LangChain4jFilters::value).toList();
  }
}
