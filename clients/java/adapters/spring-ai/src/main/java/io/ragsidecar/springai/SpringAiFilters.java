package io.ragsidecar.springai;

import io.ragsidecar.client.Filters;
import io.ragsidecar.v1.Filter;
import java.util.Collection;
import java.util.Date;
import java.util.List;
import org.springframework.ai.vectorstore.filter.Filter.Expression;
import org.springframework.ai.vectorstore.filter.Filter.Group;
import org.springframework.ai.vectorstore.filter.Filter.Key;
import org.springframework.ai.vectorstore.filter.Filter.Operand;
import org.springframework.ai.vectorstore.filter.Filter.Value;

/**
 * Spring AI's {@link Expression} (what {@code SearchRequest.filterExpression(String)} parses and
 * {@code FilterExpressionBuilder} builds) as the sidecar's {@link Filter}: {@code AND}, {@code OR}, {@code NOT},
 * {@code EQ}, {@code NE}, {@code GT}, {@code GTE}, {@code LT}, {@code LTE}, {@code IN}, {@code NIN}, {@code ISNULL}
 * (not exists) and {@code ISNOTNULL} (exists). A quoted key loses its quotes; values are strings, numbers, booleans,
 * dates and (for {@code IN}, {@code NIN}) lists of one kind. Anything else is an {@link IllegalArgumentException}
 * naming the part that cannot be translated.
 */
final class SpringAiFilters {
  private SpringAiFilters() {}

  static Filter translate(Expression expression) {
    return switch (expression.type()) {
      case AND -> Filters.and(operand(expression.left()), operand(expression.right()));
      case OR -> Filters.or(operand(expression.left()), operand(expression.right()));
      case NOT -> Filters.not(operand(expression.left()));
      case EQ -> Filters.eq(key(expression), value(expression));
      case NE -> Filters.ne(key(expression), value(expression));
      case GT -> Filters.gt(key(expression), value(expression));
      case GTE -> Filters.gte(key(expression), value(expression));
      case LT -> Filters.lt(key(expression), value(expression));
      case LTE -> Filters.lte(key(expression), value(expression));
      case IN -> Filters.in(key(expression), values(expression));
      case NIN -> Filters.notIn(key(expression), values(expression));
      case ISNULL -> Filters.not(Filters.exists(key(expression)));
      case ISNOTNULL -> Filters.exists(key(expression));
    };
  }

  private static Filter operand(Operand operand) {
    if (operand instanceof Expression e) {
      return translate(e);
    }
    if (operand instanceof Group g) {
      return translate(g.content());
    }
    throw untranslatable("a boolean operand must be an expression or a group, not " + operand);
  }

  private static String key(Expression expression) {
    if (!(expression.left() instanceof Key key)) {
      throw untranslatable(expression.type() + " needs a metadata key on its left, not " + expression.left());
    }
    String name = key.key();
    boolean quoted = name.length() >= 2 && (name.startsWith("'") && name.endsWith("'")
        || name.startsWith("\"") && name.endsWith("\""));
    return quoted ? name.substring(1, name.length() - 1) : name;
  }

  private static Object value(Expression expression) {
    Object value = rawValue(expression);
    if (value instanceof Collection<?>) {
      throw untranslatable(expression.type() + " compares with one value, not a list: " + expression);
    }
    return scalar(expression, value);
  }

  private static List<Object> values(Expression expression) {
    if (!(rawValue(expression) instanceof Collection<?> list)) {
      throw untranslatable(expression.type() + " needs a list of values: " + expression);
    }
    return list.stream().map(v -> scalar(expression, v)).toList();
  }

  private static Object rawValue(Expression expression) {
    if (!(expression.right() instanceof Value value)) {
      throw untranslatable(expression.type() + " needs a value on its right, not " + expression.right());
    }
    return value.value();
  }

  private static Object scalar(Expression expression, Object value) {
    if (value instanceof String || value instanceof Number || value instanceof Boolean) {
      return value;
    }
    if (value instanceof Date date) {
      return date.toInstant();
    }
    if (value instanceof Enum<?> e) {
      return e.name();
    }
    throw untranslatable("value " + value + " (" + (value == null ? "null" : value.getClass().getSimpleName())
        + ") in " + expression + " is not a string, number, boolean or date");
  }

  private static IllegalArgumentException untranslatable(String why) {
    return new IllegalArgumentException("cannot translate the Spring AI filter to the sidecar's: " + why);
  }
}
