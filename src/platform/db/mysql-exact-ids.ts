import {
  BinaryOperationNode,
  ColumnNode,
  OperationNodeTransformer,
  PrimitiveValueListNode,
  ReferenceNode,
  ValueListNode,
  ValueNode,
  type KyselyPlugin,
  type OperationNode,
  type PluginTransformQueryArgs,
  type PluginTransformResultArgs,
  type QueryResult,
  type RootOperationNode,
  type UnknownRow,
} from 'kysely';

/** Columns holding 64-bit ids, which the code carries as decimal strings (post ids pass 2^53). */
const ID_COLUMNS = new Set(['id', 'post_id']);
const DIGITS = /^\d{1,20}$/;

/**
 * Sends ids compared with an id column as integers, not quoted strings. MySQL compares a BIGINT
 * column with a string as two doubles, which cannot tell apart ids near 2^58 that differ by less
 * than 64: `WHERE id = '…749'` would also find the post `…750`. (MariaDB compares them exactly;
 * both compare integers exactly.)
 */
export class MysqlExactIdsPlugin implements KyselyPlugin {
  readonly #transformer = new ExactIds();

  transformQuery(args: PluginTransformQueryArgs): RootOperationNode {
    return this.#transformer.transformNode(args.node);
  }

  transformResult(args: PluginTransformResultArgs): Promise<QueryResult<UnknownRow>> {
    return Promise.resolve(args.result);
  }
}

class ExactIds extends OperationNodeTransformer {
  protected override transformBinaryOperation(node: BinaryOperationNode): BinaryOperationNode {
    const transformed = super.transformBinaryOperation(node);
    if (!isIdColumn(transformed.leftOperand)) return transformed;
    const right = asIntegers(transformed.rightOperand);
    return right === transformed.rightOperand
      ? transformed
      : BinaryOperationNode.create(transformed.leftOperand, transformed.operator, right);
  }
}

function isIdColumn(node: OperationNode): boolean {
  const column = ReferenceNode.is(node) ? node.column : node;
  return ColumnNode.is(column) && ID_COLUMNS.has(column.column.name);
}

const asInteger = (value: unknown): unknown =>
  typeof value === 'string' && DIGITS.test(value) ? BigInt(value) : value;

function asIntegers(node: OperationNode): OperationNode {
  if (ValueNode.is(node)) {
    const value = asInteger(node.value);
    return value === node.value ? node : ValueNode.create(value);
  }
  if (PrimitiveValueListNode.is(node)) return PrimitiveValueListNode.create(node.values.map(asInteger));
  if (ValueListNode.is(node)) return ValueListNode.create(node.values.map(asIntegers));
  return node;
}
