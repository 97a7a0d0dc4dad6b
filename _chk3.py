import time
from compiler.frontend.importer import import_model
from tests.test_dynamic_import import assert_same_as_static
C='/root/.cache/onnx-aot/models/rapidocr-onnxruntime-1.4.4/rapidocr_onnxruntime/models/'
P=C+'ch_PP-OCRv4_rec_infer.onnx'
t=time.perf_counter()
g = import_model(P, {'x': ((1,8),3,48,(32,2048))})
print(time.perf_counter()-t, g.symbols, [v.shape for v in g.outputs])
for b, w in [(1, 320), (3, 160), (8, 1280)]:
    s = import_model(P, {'x': (b,3,48,w)})
    print(b, w, assert_same_as_static(g, s, {'p2o_DynamicDimension_0': b, 'p2o_DynamicDimension_1': w}))
P=C+'ch_ppocr_mobile_v2.0_cls_infer.onnx'
g = import_model(P, {'x': ((1,8),3,48,(32,512))})
print(g.symbols, [v.shape for v in g.outputs])
for b, w in [(1, 192), (5, 100)]:
    s = import_model(P, {'x': (b,3,48,w)})
    print(b, w, assert_same_as_static(g, s, {'x_0': b, 'x_3': w}))
