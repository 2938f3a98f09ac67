using System.Net;
using System.Net.Http.Headers;
using System.Text;
using Grpc.Core;
using Grpc.Net.Client;
using TechEmpower.Tests.Infrastructure;

namespace TechEmpower.Tests.Endpoints;

/// <summary>
/// The sample with <c>--protocols http2</c>: HTTP/2 with prior knowledge (h2c), as h2load and gRPC clients speak it
/// on a cleartext port, and the gRPC echo service through the real gRPC client (Grpc.Net.Client), one call alone,
/// many multiplexed on one connection, and one larger than HTTP/2's flow-control windows; and its bidirectional
/// streaming method, messages and echoes interleaved on one call and on many calls at once.
/// </summary>
/// <typeparam name="TFixture">The running sample.</typeparam>
/// <param name="sample">The running sample.</param>
public abstract class Http2Endpoints<TFixture>(TFixture sample) : IClassFixture<TFixture>
    where TFixture : SampleFixture
{
    private const string HelloWorldJson = """{"message":"Hello, World!"}""";

    // The wire contract, spelled out here rather than taken from the sample, so a change to it fails these tests.
    private static readonly Marshaller<byte[]> Bytes = Marshallers.Create(static m => m, static d => d);
    private static readonly Method<byte[], byte[]> Unary = new(MethodType.Unary, "techempower.Echo", "Unary", Bytes, Bytes);
    private static readonly Method<byte[], byte[]> Bidi = new(MethodType.DuplexStreaming, "techempower.Echo", "Bidi", Bytes, Bytes);

    private TFixture Sample { get; } = sample;

    [Fact]
    public void Startup_line_names_the_transport_and_http2()
    {
        var line = Sample.Sample.StartupLine;
        Assert.Matches(Sample.ExpectedTransport, line);
        Assert.Contains(" mode=middleware protocols=Http2 urls=", line, StringComparison.Ordinal);
    }

    [Fact]
    public async Task Json_is_served_over_h2c_with_prior_knowledge()
    {
        using var request = new HttpRequestMessage(HttpMethod.Get, new Uri("/json", UriKind.Relative))
        {
            Version = HttpVersion.Version20,
            VersionPolicy = HttpVersionPolicy.RequestVersionExact,
        };
        using var response = await Sample.Client.SendAsync(request);

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal(HttpVersion.Version20, response.Version);
        Assert.Equal("application/json", response.Content.Headers.ContentType?.MediaType);
        Assert.Equal(HelloWorldJson.Length, response.Content.Headers.ContentLength);
        Assert.Equal(HelloWorldJson, await response.Content.ReadAsStringAsync());
    }

    [Fact]
    public async Task Grpc_unary_call_answers_with_the_request_bytes()
    {
        using var channel = Channel();
        var payload = "TechEmpower gRPC unary payload"u8.ToArray();

        using var call = channel.CreateCallInvoker().AsyncUnaryCall(Unary, null, Options(), payload);
        var answer = await call.ResponseAsync;

        Assert.Equal(payload, answer);
        Assert.Equal(StatusCode.OK, call.GetStatus().StatusCode);
    }

    [Fact]
    public async Task Sixty_four_concurrent_calls_on_one_connection_each_get_their_own_answer()
    {
        using var channel = Channel();
        var invoker = channel.CreateCallInvoker();
        var payloads = Enumerable.Range(0, 64).Select(i => Encoding.ASCII.GetBytes($"call {i:D2} " + new string('x', i * 37))).ToList();

        var answers = await Task.WhenAll(payloads.Select(p => invoker.AsyncUnaryCall(Unary, null, Options(), p).ResponseAsync));

        for (var i = 0; i < payloads.Count; i++)
        {
            Assert.Equal(payloads[i], answers[i]);
        }
    }

    /// <summary>1 MiB each way: more than Kestrel's stream window (768 KiB) and the client's, so both wait for WINDOW_UPDATE.</summary>
    [Fact]
    public async Task A_call_larger_than_the_flow_control_windows_is_answered_whole()
    {
        using var channel = Channel();
        var payload = Enumerable.Range(0, 1 << 20).Select(i => (byte)(i % 251)).ToArray();

        var answer = await channel.CreateCallInvoker().AsyncUnaryCall(Unary, null, Options(), payload).ResponseAsync;

        Assert.Equal(payload.Length, answer.Length);
        Assert.True(payload.AsSpan().SequenceEqual(answer), "The answer's bytes differ from the request's.");
    }

    /// <summary>
    /// One bidirectional call, each message's echo read before the next is sent: sizes from empty (a 5-byte frame
    /// with no payload) to one above 64 KiB (several DATA frames, more than HTTP/2's default stream window), each with
    /// its own bytes; then the client ends its stream, and the call ends with OK and no further message.
    /// </summary>
    [Fact]
    public async Task Grpc_bidi_call_echoes_each_message_in_order_until_the_client_ends_its_stream()
    {
        using var channel = Channel();
        using var call = channel.CreateCallInvoker().AsyncDuplexStreamingCall(Bidi, null, Options());
        int[] sizes = [5, 1_000, 0, 1, 100_000, 16_385, 64];

        for (var n = 0; n < sizes.Length; n++)
        {
            var message = Enumerable.Range(0, sizes[n]).Select(i => (byte)((i + (31 * n) + 1) % 251)).ToArray();
            await call.RequestStream.WriteAsync(message);

            Assert.True(await call.ResponseStream.MoveNext(), $"The call ended before the echo of message {n} ({message.Length} bytes).");
            var echo = call.ResponseStream.Current;
            Assert.Equal(message.Length, echo.Length);
            Assert.True(message.AsSpan().SequenceEqual(echo), $"The echo of message {n} ({message.Length} bytes) differs from it.");
        }

        await call.RequestStream.CompleteAsync();
        Assert.False(await call.ResponseStream.MoveNext(), "A message came after the client ended its stream.");
        Assert.Equal(StatusCode.OK, call.GetStatus().StatusCode);
    }

    /// <summary>Sixteen bidirectional calls at once on one connection, each getting only its own echoes, in order.</summary>
    [Fact]
    public async Task Sixteen_concurrent_bidi_calls_on_one_connection_each_get_their_own_echoes()
    {
        using var channel = Channel();
        var invoker = channel.CreateCallInvoker();

        await Task.WhenAll(Enumerable.Range(0, 16).Select(async c =>
        {
            using var call = invoker.AsyncDuplexStreamingCall(Bidi, null, Options());
            for (var n = 0; n < 20; n++)
            {
                var message = Encoding.ASCII.GetBytes($"call {c:D2} message {n:D2} " + new string((char)('a' + c), (c * 97) + n));
                await call.RequestStream.WriteAsync(message);
                Assert.True(await call.ResponseStream.MoveNext(), $"Call {c} ended before the echo of message {n}.");
                Assert.Equal(message, call.ResponseStream.Current);
            }

            await call.RequestStream.CompleteAsync();
            Assert.False(await call.ResponseStream.MoveNext(), $"Call {c} had a message after the client ended its stream.");
            Assert.Equal(StatusCode.OK, call.GetStatus().StatusCode);
        }));
    }

    [Fact]
    public async Task An_unknown_method_of_the_service_is_unimplemented()
    {
        using var channel = Channel();
        var missing = new Method<byte[], byte[]>(MethodType.Unary, "techempower.Echo", "Missing", Bytes, Bytes);

        var failure = await Assert.ThrowsAsync<RpcException>(
            () => channel.CreateCallInvoker().AsyncUnaryCall(missing, null, Options(), [1, 2, 3]).ResponseAsync);

        Assert.Equal(StatusCode.Unimplemented, failure.StatusCode);
        Assert.Equal("Method is unimplemented.", failure.Status.Detail);   // the service's answer, not a mapped 404
    }

    [Fact]
    public async Task Plain_http2_post_to_the_grpc_method_gets_the_grpc_framing()
    {
        // What h2load sends in compare.sh's grpc-unary scenario: one length-prefixed message, no gRPC client.
        byte[] message = [.. "\0\0\0\0\u0003"u8, 7, 8, 9];
        using var request = new HttpRequestMessage(HttpMethod.Post, new Uri("/techempower.Echo/Unary", UriKind.Relative))
        {
            Version = HttpVersion.Version20,
            VersionPolicy = HttpVersionPolicy.RequestVersionExact,
            Content = new ByteArrayContent(message) { Headers = { ContentType = new MediaTypeHeaderValue("application/grpc") } },
        };
        request.Headers.TE.ParseAdd("trailers");
        using var response = await Sample.Client.SendAsync(request);

        Assert.Equal(HttpStatusCode.OK, response.StatusCode);
        Assert.Equal("application/grpc", response.Content.Headers.ContentType?.MediaType);
        Assert.Equal(message, await response.Content.ReadAsByteArrayAsync());
        Assert.Equal("0", Assert.Single(response.TrailingHeaders.GetValues("grpc-status")));
    }

    private static CallOptions Options() => new(deadline: DateTime.UtcNow + TestTimeouts.Request);

    // An http:// address makes Grpc.Net.Client speak HTTP/2 with prior knowledge; one handler, one connection.
    private GrpcChannel Channel() => GrpcChannel.ForAddress(Sample.TcpUrl, new GrpcChannelOptions { HttpHandler = new SocketsHttpHandler() });
}
