package io.ragsidecar.springai;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ragsidecar.client.Filters;
import java.time.Instant;
import java.util.Date;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.springframework.ai.vectorstore.filter.Filter;
import org.springframework.ai.vectorstore.filter.FilterExpressionBuilder;
import org.springframework.ai.vectorstore.filter.FilterExpressionTextParser;

/** Spring AI's filter expressions, parsed by Spring AI, as the sidecar's filters (no server: the translation only). */
class SpringAiFiltersTest {
  private static io.ragsidecar.v1.Filter parse(String text) {
    return SpringAiFilters.translate(new FilterExpressionTextParser().parse(text));
  }

  @Test
  void everyOperatorOfTheTextSyntax() {
    assertEquals(Filters.and(Filters.eq("room", "kitchen"), Filters.gte("watts", 2)),
        parse("room == 'kitchen' && watts >= 2"));
    assertEquals(Filters.or(Filters.ne("a", true), Filters.lt("b", 1.5)), parse("a != true || b < 1.5"));
    assertEquals(Filters.and(Filters.lte("x", 3), Filters.gt("y", -1)), parse("x <= 3 AND y > -1"));
    assertEquals(Filters.in("tags", List.of("p", "q")), parse("tags in ['p', 'q']"));
    assertEquals(Filters.notIn("tags", List.of("p")), parse("tags not in ['p']"));
    assertEquals(Filters.not(Filters.eq("room", "garden")), parse("NOT (room == 'garden')"));
  }

  @Test
  void builtExpressionsDatesNullTestsAndQuotedKeys() {
    FilterExpressionBuilder b = new FilterExpressionBuilder();
    Instant at = Instant.parse("2025-01-01T00:00:00Z");
    assertEquals(Filters.gte("bought", at), SpringAiFilters.translate(b.gte("bought", Date.from(at)).build()));
    assertEquals(Filters.exists("tags"), SpringAiFilters.translate(b.isNotNull("tags").build()));
    assertEquals(Filters.not(Filters.exists("tags")), SpringAiFilters.translate(b.isNull("tags").build()));
    assertEquals(Filters.eq("conversationId", "c1"), SpringAiFilters.translate(new Filter.Expression(
        Filter.ExpressionType.EQ, new Filter.Key("'conversationId'"), new Filter.Value("c1"))));
  }

  @Test
  void whatHasNoCounterpartIsNamed() {
    IllegalArgumentException list = assertThrows(IllegalArgumentException.class, () -> SpringAiFilters.translate(
        new Filter.Expression(Filter.ExpressionType.EQ, new Filter.Key("k"), new Filter.Value(List.of("a")))));
    assertTrue(list.getMessage().contains("cannot translate") && list.getMessage().contains("one value"),
        list.getMessage());
    IllegalArgumentException in = assertThrows(IllegalArgumentException.class, () -> SpringAiFilters.translate(
        new Filter.Expression(Filter.ExpressionType.IN, new Filter.Key("k"), new Filter.Value("a"))));
    assertTrue(in.getMessage().contains("list of values"), in.getMessage());
  }
}
